"""coursekit.timing: repeats, minimum, spread and comparisons, on a fake clock (no wall-clock assertions)."""
import itertools

import pytest

from coursekit.timing import Timing, compare, distinct, time_it


def clock_of(durations):
    """A clock whose successive start/stop pairs are `durations` apart."""
    ticks = itertools.accumulate(itertools.chain([0.0], *[(d, 0.0) for d in durations]))
    return lambda: next(ticks)


def test_time_it_warms_up_untimed_and_keeps_every_repeat():
    calls = []
    t = time_it(lambda: calls.append(1), repeats=3, warmup=2, clock=clock_of([0.3, 0.1, 0.2]))
    assert len(calls) == 5
    assert t.times == pytest.approx((0.3, 0.1, 0.2))
    assert t.best == pytest.approx(0.1) and t.median == pytest.approx(0.2) and t.spread == pytest.approx(1.0)
    assert str(t) == "100.0 ms (min of 3; median 200.0 ms)"


def test_compare_says_within_noise_when_the_repeats_overlap():
    fast, slow = Timing((1.0, 1.1, 1.2)), Timing((1.05, 1.3, 1.4))
    assert not distinct(fast, slow)
    assert compare(fast, slow, ("lora", "full")) == "0.95x (lora / full), within noise: no conclusion"
    far = Timing((2.0, 2.1, 2.2))
    assert distinct(fast, far) and compare(far, fast).startswith("2.00x (a / b), beyond")


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError, match="repeats"):
        time_it(lambda: None, **kwargs)
    with pytest.raises(ValueError):
        Timing(())
