"""coursekit.distributed: the simulated world against the arithmetic and against real gloo ranks (same results,
same bytes booked per rank), and launch()'s failures: a rank that raises, a rank that hangs, no process left."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
from coursekit.distributed import PartialWorld, RankFailed, SimWorld, launch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="launch() forks (Linux only)")


def _inputs(rank: int, n: int = 12) -> torch.Tensor:
    return torch.linspace(-1, 1, n) * (rank + 1) + rank


def every_collective(world):
    """One call of each collective, written once for both worlds: lists hold a tensor per rank this process plays."""
    ranks = world.ranks
    summed = world.all_reduce([_inputs(r) for r in ranks], op="sum")
    mean = world.all_reduce([_inputs(r) for r in ranks], op="mean")
    shards = world.reduce_scatter([_inputs(r) for r in ranks], op="sum")
    gathered = world.all_gather([torch.full((3,), float(r)) for r in ranks])
    sent = world.broadcast([_inputs(r) for r in ranks], src=world.size - 1)
    return {r: {"sum": summed[i], "mean": mean[i], "shard": shards[i], "gathered": gathered[i],
                "broadcast": sent[i], "sent": world.traffic.sent[r], "received": world.traffic.received[r]}
            for i, r in enumerate(ranks)}


def test_sim_world_computes_the_collectives():
    world = SimWorld(3)
    out = every_collective(world)
    total = sum(_inputs(r) for r in range(3))
    for r in range(3):
        torch.testing.assert_close(out[r]["sum"], total)
        torch.testing.assert_close(out[r]["mean"], total / 3)
        torch.testing.assert_close(out[r]["shard"], total[4 * r:4 * r + 4])
        torch.testing.assert_close(out[r]["gathered"], torch.tensor([0., 0, 0, 1, 1, 1, 2, 2, 2]))
        torch.testing.assert_close(out[r]["broadcast"], _inputs(2))


def test_sim_world_books_ring_traffic():
    """S = 48 bytes (12 float32) on 3 ranks: all-reduce 2·2/3·S, reduce-scatter 2/3·S, all-gather 2/3 of the gathered
    36 bytes, broadcast S along the chain 2 -> 0 -> 1 (rank 1, the last, forwards nothing; rank 2 receives nothing)."""
    world = SimWorld(3)
    every_collective(world)
    ring = 2 * 64 + 32 + 24
    assert world.traffic.sent == [ring + 48, ring, ring + 48]
    assert world.traffic.received == [ring + 48, ring + 48, ring]
    assert [c for c, _ in world.traffic.calls] == ["all_reduce", "all_reduce", "reduce_scatter", "all_gather",
                                                   "broadcast"]
    world.traffic.reset()
    assert world.traffic.sent == [0, 0, 0] and not world.traffic.calls
    single = SimWorld(1)
    every_collective(single)
    assert single.traffic.sent == [0] and single.traffic.received == [0]


def test_partial_world_plays_some_ranks_and_simulates_the_others():
    """Ranks 0 and 2 of 3 played here, rank 1 holding 0.5 everywhere: the collectives give what the full world would,
    lists hold the played ranks only, and the traffic booked is the full world's."""
    world = PartialWorld(3, ranks=[2, 0], fill=0.5)
    assert world.ranks == (0, 2)
    out = every_collective(world)
    assert sorted(out) == [0, 2]
    total = _inputs(0) + _inputs(2) + 0.5
    for r in (0, 2):
        torch.testing.assert_close(out[r]["sum"], total)
        torch.testing.assert_close(out[r]["mean"], total / 3)
        torch.testing.assert_close(out[r]["shard"], total[4 * r:4 * r + 4])
        torch.testing.assert_close(out[r]["gathered"], torch.tensor([0., 0, 0, .5, .5, .5, 2, 2, 2]))
        torch.testing.assert_close(out[r]["broadcast"], _inputs(2))
    full = SimWorld(3)
    every_collective(full)
    assert world.traffic.sent == full.traffic.sent and world.traffic.received == full.traffic.received
    elsewhere = world.broadcast([torch.zeros(2), torch.ones(2)], src=1)
    assert all(torch.equal(t, torch.full((2,), 0.5)) for t in elsewhere)
    with pytest.raises(ValueError, match="distinct ranks"):
        PartialWorld(3, ranks=[0, 3])
    assert "drawn" in repr(PartialWorld(3, ranks=[0], seed=5)) and "5" not in repr(PartialWorld(3, ranks=[0], seed=5))
    with pytest.raises(ValueError, match="one tensor per rank"):
        world.all_reduce([torch.ones(2)] * 3)


def test_a_seeded_partial_world_draws_the_other_ranks_element_by_element():
    """With a seed, the other ranks hold a_r t + b_r of this process's first tensor in a reduction (a constant b_r in a
    gather): the same drawn numbers for the same seed, other numbers for another, and the same result whether a call
    is one flat bucket or one per tensor."""
    a, b = torch.randn(5, dtype=torch.float64), torch.randn(3, dtype=torch.float64)

    def per_tensor(world):
        ts = [[a.clone(), b.clone()] for _ in world.ranks]
        for pair in zip(*ts):
            world.all_reduce(list(pair), op="mean")
        return torch.cat(ts[0])

    def bucket(world):
        flats = [torch.cat([a, b]) for _ in world.ranks]
        world.all_reduce(flats, op="mean")
        return flats[0]

    one, same, other = (PartialWorld(4, ranks=[1, 2], seed=s) for s in (7, 7, 8))
    torch.testing.assert_close(per_tensor(one), bucket(same))
    assert not torch.allclose(bucket(PartialWorld(4, ranks=[1, 2], seed=7)), bucket(other))
    assert not torch.allclose(bucket(PartialWorld(4, ranks=[1, 2], seed=7)), torch.cat([a, b]))
    gathered = PartialWorld(3, ranks=[0], seed=3).all_gather([torch.ones(2)])[0]
    assert torch.equal(gathered[:2], torch.ones(2)) and not torch.equal(gathered[2:], torch.ones(4))
    # A gathered shard of another rank holds nothing of ours: what we keep in padding never reaches it.
    assert torch.equal(PartialWorld(3, ranks=[0], seed=3).all_gather([torch.tensor([5.0, -9.0])])[0][2:], gathered[2:])


@pytest.mark.parametrize("call, error", [
    (lambda w: w.all_reduce([torch.ones(2)]), "one tensor per rank"),
    (lambda w: w.all_reduce([torch.ones(2), torch.ones(3)]), "same shape"),
    (lambda w: w.all_reduce([torch.ones(2)] * 2, op="max"), "op must be"),
    (lambda w: w.reduce_scatter([torch.ones(3)] * 2), "multiple of the world size"),
    (lambda w: w.all_gather([torch.ones(2, 2)] * 2), "flat shards"),
    (lambda w: w.broadcast([torch.ones(2)] * 2, src=2), "src must be"),
])
def test_sim_world_refuses_bad_calls(call, error):
    with pytest.raises((ValueError, TypeError), match=error):
        call(SimWorld(2))
    with pytest.raises(ValueError, match="positive integer"):
        SimWorld(0)


@pytest.mark.parametrize("size", [2, 3])
def test_real_gloo_ranks_agree_with_the_simulated_world(size):
    real = launch(every_collective, size, timeout=120, echo=False)
    sim = every_collective(SimWorld(size))
    for r in range(size):
        got = real.results[r][r]
        for key in ("sum", "mean", "shard", "gathered", "broadcast"):
            torch.testing.assert_close(got[key], sim[r][key], rtol=1e-6, atol=1e-6, msg=f"rank {r}: {key}")
        assert (got["sent"], got["received"]) == (sim[r]["sent"], sim[r]["received"]), f"rank {r}: bytes booked"
    assert not multiprocessing.active_children()


def _fails_on_rank_one(world):
    if world.rank == 1:
        raise ArithmeticError("rank one's own mistake")
    world.all_reduce([torch.ones(2)])  # waits for rank 1, which never comes: the run is stopped
    return "never"


def _hangs_on_rank_zero(world):
    if world.rank == 0:
        import time
        time.sleep(600)
    print("rank", world.rank, "done")
    return world.rank


def test_a_failing_rank_stops_the_run_with_its_traceback():
    with pytest.raises(RankFailed, match=r"(?s)rank 1 of 2 raised.*ArithmeticError: rank one's own mistake"):
        launch(_fails_on_rank_one, 2, timeout=120, echo=False)
    assert not multiprocessing.active_children()


def test_a_hanging_rank_is_killed_at_the_deadline():
    """Rank 0 never returns: the run stops at the deadline naming it (and rank 1 too, on a machine so busy that
    rank 1 had not finished either), with what finished ranks printed, and leaves no process."""
    with pytest.raises(TimeoutError, match=r"ranks \[0(, 1)?\] of 2 did not finish within 8 s") as failure:
        launch(_hangs_on_rank_zero, 2, timeout=8, echo=False)
    message = str(failure.value)
    assert "ranks [0, 1]" in message or "rank 1: 'rank 1 done" in message, message
    assert not multiprocessing.active_children()


def test_launch_refuses_a_bad_world_size():
    with pytest.raises(ValueError, match="positive integer"):
        launch(every_collective, 0)


def test_the_same_function_runs_under_torchrun(tmp_path):
    """Across machines, torchrun starts the ranks: torchrun_main runs the function on each (2 local ranks here)."""
    script = tmp_path / "collective.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from coursekit.distributed import torchrun_main

        def work(world):
            t = torch.full((4,), float(world.rank + 1))
            world.all_reduce([t], op="mean")
            return t.tolist(), world.traffic.sent[world.rank]

        values, sent = torchrun_main(work)
        print(f"rank {{os.environ['RANK']}}: {{values}} sent {{sent}}")
    """))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(torchrun, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: [1.5, 1.5, 1.5, 1.5] sent 16" in proc.stdout, proc.stdout
