"""The grading sandbox: the judge/worker protocol, outcomes and reasons, limits, isolation.

Most tests run a small program and a check function through ``judge._run_one`` (what
``run_checks`` does for one grade_id); the toy chapter ``ch99_toy`` exercises ``run_checks``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import toy_chapter as toy
import torch
from torch import nn

from coursekit.checks import check_close
from grader import probes
from grader.api import LocalNamespace, checks_for, fetch
from grader.sandbox import judge, policy
from grader.sandbox.rpc import MissingName
from grader.sandbox.worker import UID_BASE

LIMITS = judge.Limits(wall_seconds=20.0, memory_bytes=3 * 1024**3, output_bytes=64 * 1024)
SETUP = "import os, sys, math\nimport torch\nfrom torch import nn\n"


@pytest.fixture(scope="module", autouse=True)
def chapter():
    toy.register()


def run(check, *cells: str, limits: judge.Limits = LIMITS):
    """Outcome of ``check`` against a program made of SETUP and ``cells``."""
    return judge._run_one("test_x", check, [SETUP, *cells], limits)


# --- the toy chapter itself ---------------------------------------------------------------

def _local(*cells: str) -> LocalNamespace:
    namespace: dict = {}
    for cell in toy.program(*cells):
        exec(cell, namespace)
    return LocalNamespace(namespace)


def test_toy_hidden_tests_pass_in_kernel_on_the_solution_and_fail_on_a_wrong_one():
    checks = checks_for(toy.CHAPTER)
    assert sorted(checks) == sorted(toy.GRADE_IDS)
    for check in checks.values():
        check(_local(toy.SOLUTION))
    wrong = toy.SOLUTION.replace("alpha * x.sum", "x.sum")
    wrong = wrong.replace("x @ self.weight.T", "x @ self.weight.T + 1")
    for check in checks.values():
        with pytest.raises(AssertionError):
            check(_local(wrong))


def test_run_checks_scores_the_toy_chapter():
    outcomes = judge.run_checks(toy.CHAPTER, toy.program(toy.SOLUTION), toy.GRADE_IDS, LIMITS,
                                checks=checks_for(toy.CHAPTER))
    assert {g: o.passed for g, o in outcomes.items()} == {g: True for g in toy.GRADE_IDS}
    wrong = toy.SOLUTION.replace("alpha * x.sum", "x.sum")
    # Without checks=, the judge asks the resolver grader.api installed (grader.sandbox.settings).
    outcomes = judge.run_checks(toy.CHAPTER, toy.program(wrong), toy.GRADE_IDS + ["test_nope"], LIMITS)
    assert not outcomes["test_scaled_sum"].passed
    assert "multiply by alpha" in outcomes["test_scaled_sum"].reason
    assert outcomes["test_linear_no_bias"].passed
    assert outcomes["test_nope"] == judge.Outcome("test_nope", False,
                                                  "the grader has no hidden test for this cell")


# --- handles and the protocol -----------------------------------------------------------------

PROGRAM = '''
class Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        if factor == 0:
            raise ValueError("factor must be non-zero, got 0")
        self.factor = nn.Parameter(torch.tensor([float(factor)]))  # 1-d: the codec cannot fetch 0-d tensors

    def forward(self, x):
        return self.factor * x

def combine(items, weights=None, *, offset=0.0):
    weights = weights or {k: 1.0 for k in items}
    return sum(weights[k] * v for k, v in items.items()) + offset

table = {"a": [1, 2.5, "three", None, True], "b": (torch.arange(3), torch.float16)}
'''


def test_handles_support_attributes_calls_items_put_fetch_and_probes():
    def check(nb):
        layer = nb.Scale(3.0)
        x = torch.randn(4, 5)
        assert repr(layer) == "<remote Scale>"
        check_close(fetch(layer(x)), 3.0 * x, "forward")
        check_close(fetch(layer.forward(nb.put(x))), 3.0 * x, "forward via put")
        assert fetch(layer.factor.item()) == 3.0
        assert fetch(nb.table["a"]) == [1, 2.5, "three", None, True]
        arange, dtype = fetch(nb.table["b"])
        assert arange.tolist() == [0, 1, 2] and dtype is torch.float16
        items = {"p": nb.put(torch.ones(2)), "q": torch.full((2,), 2.0)}
        out = nb.combine(items, {"p": 1.0, "q": 10.0}, offset=nb.put(0.5))
        check_close(fetch(out), torch.full((2,), 21.5), "combine")
        remote_model = nb.put(nn.Linear(5, 2))
        assert fetch(remote_model.weight.shape) == torch.Size([2, 5])
        table = nb.apply(probes.param_table, layer)
        assert list(table) == ["factor"] and table["factor"]["requires_grad"] is True
        assert nb.apply(probes.raised, nb.Scale, 0) == ["ValueError", "Exception", "BaseException", "object"]
        assert nb.apply(probes.raised, nb.Scale, 1) is None

    assert run(check, PROGRAM) == judge.Outcome("test_x", True, "")


def test_handles_refuse_comparison_and_apply_refuses_non_probes():
    def check(nb):
        layer = nb.Scale(2.0)
        for misuse in (lambda: bool(layer), lambda: layer == 2, lambda: layer < 2, lambda: list(layer)):
            with pytest.raises(TypeError):
                misuse()
        with pytest.raises(ValueError):
            nb.apply(os.getcwd)
        with pytest.raises(ValueError):
            nb.apply(lambda m: m, layer)
        with pytest.raises(ValueError):  # private helpers of a chapter's probes are not probes
            nb.apply(probes._ch10_trace, layer, (), {})
        with pytest.raises(ValueError):  # a name bound in the probe package but defined elsewhere
            nb.apply(probes.shared.measure, layer)
        with pytest.raises(AttributeError):
            nb._private

    assert run(check, PROGRAM).passed


def test_probes_of_every_module_of_the_probe_package_run_and_travel():
    """Chapter modules' probes run by name in the worker, and instances of their classes are sent
    in (unpickled there from a module the fork server preloaded); the grader's other objects are not."""
    def check(nb):
        batches = nb.put(probes.ch03_Batches([torch.ones(2), torch.zeros(2)]))
        assert nb.apply(probes.ch03_describe, batches)["type"] == "ch03_Batches"
        assert nb.apply(probes.ch07_describe, [1, 2.5])["items"][1] == {"type": "float", "value": 2.5}
        with pytest.raises(TypeError, match="cannot be sent"):
            nb.put(checks_for)

    assert run(check, PROGRAM).passed


def test_student_exceptions_become_student_errors_with_a_readable_reason():
    def check(nb):
        with pytest.raises(judge.StudentError) as info:
            nb.Scale(0)
        assert str(info.value) == "Scale raised ValueError: factor must be non-zero, got 0"
        assert info.value.types[:2] == ["ValueError", "Exception"]
        nb.Scale(0)

    outcome = run(check, PROGRAM)
    assert outcome.reason == "your code raised ValueError: factor must be non-zero, got 0 (calling Scale)"


def test_exception_messages_are_truncated():
    outcome = run(lambda nb: nb.boom(), "def boom():\n    raise RuntimeError('x' * 10000)")
    assert outcome.reason.startswith("your code raised RuntimeError: xxx")
    assert len(outcome.reason) < 600


def test_a_missing_name_says_which_cell_failed():
    outcome = run(lambda nb: nb.Scale(1), "class Scale(nn.Module)\n    pass")
    assert outcome.reason.startswith("the notebook does not define 'Scale': did you run its exercise cell?")
    assert "SyntaxError" in outcome.reason


def test_assertion_messages_pass_through_and_other_check_errors_stay_generic():
    def teaching(nb):
        raise AssertionError("dA differs from the reference: is the update scaled by alpha / rank?")

    def broken(nb):
        secret = {"expected": 42}
        return secret["missing"]

    assert run(teaching).reason == "dA differs from the reference: is the update scaled by alpha / rank?"
    assert run(lambda nb: (_ for _ in ()).throw(AssertionError())).reason == "a hidden test failed"
    reason = run(broken).reason
    assert reason == "the hidden test could not be completed on your code (KeyError)"


def test_values_that_cannot_be_fetched_fail_with_a_message():
    outcome = run(lambda nb: fetch(nb.Scale(1)), PROGRAM)
    assert outcome.reason.startswith("the grader could not read back a value from your code: a Scale cannot")


def test_cells_keep_running_after_an_error_like_a_notebook():
    def check(nb):
        assert fetch(nb.after) == 2

    assert run(check, "before = 1\nraise KeyError('oops')", "after = 2").passed


def test_cells_run_as_plain_python_and_get_ipython_is_inert():
    """The worker compiles cells with compile() alone: IPython syntax is a syntax error there (the
    source policy refuses such exercise cells before they reach a worker), and get_ipython() does
    nothing."""
    program = ("get_ipython().set_custom_exc((Exception,), print)\n"
               "get_ipython().events.register('post_run_cell', print)\na = 1",
               "%time b = a + 1", "!ls /", "c = a + 2",
               "get_ipython().run_line_magic('time', 'd = 1')\nget_ipython().run_cell_magic('capture', '', 'e = 1')")

    def check(nb):
        assert fetch(nb.a) == 1 and fetch(nb.c) == 3
        assert [e["error"].split(":")[0] for e in nb._worker.cell_errors] == ["SyntaxError", "SyntaxError"]
        for name in ("d", "e"):  # a magic's body is a string no policy read: the worker's shell runs none
            with pytest.raises(MissingName):
                nb[name]
        nb.b

    outcome = run(check, *program)
    assert not outcome.passed and "does not define 'b'" in outcome.reason


# --- limits -----------------------------------------------------------------------------------

def test_cpu_time_limit():
    limits = judge.Limits(cpu_seconds=1.0, wall_seconds=60.0, memory_bytes=LIMITS.memory_bytes)
    outcome = run(lambda nb: nb.spin(), "def spin():\n    while True:\n        pass", limits=limits)
    assert outcome.reason == "your code used more CPU time than the time limit of 1 s allows"


def test_wall_clock_backstop_stops_code_that_waits():
    limits = judge.Limits(cpu_seconds=30.0, wall_seconds=2.0, memory_bytes=LIMITS.memory_bytes)
    outcome = run(lambda nb: nb.wait(), "import time\ndef wait():\n    time.sleep(3600)", limits=limits)
    assert outcome.reason.startswith("your code did not finish within the wall-clock time limit of 2 s")


def test_memory_limit():
    outcome = run(lambda nb: nb.hog(), "def hog():\n    keep = []\n    while True:\n"
                                       "        keep.append(torch.ones(2**25))")
    assert outcome.reason == "your code exceeded the memory limit of 3 GiB"


def test_a_crashing_worker_fails_only_its_problem():
    assert run(lambda nb: nb.leave(), "def leave():\n    os._exit(3)").reason == \
        "your code's process exited early (status 3)"
    # As the first process of its own PID namespace the worker ignores the SIGABRT it sends itself;
    # abort() then stops it with a fault.
    reason = run(lambda nb: nb.crash(), "def crash():\n    os.abort()").reason
    assert reason.startswith("your code's process was stopped by signal SIG")


def test_output_is_capped_and_never_shown():
    program = ("print('HELLO-FROM-STUDENT' * 10**5)\nsys.stderr.write('E' * 10**6)\n"
               "def output_size():\n    return os.path.getsize('.output')")

    def check(nb):
        assert fetch(nb.output_size()) <= 1000
        assert False, "nothing of the student's output belongs here"

    outcome = run(check, program, limits=judge.Limits(output_bytes=1000, memory_bytes=LIMITS.memory_bytes))
    assert "HELLO" not in outcome.reason


def test_a_forged_reply_is_malformed():
    program = '''
import json
def forge():
    for fd in range(3, 32):
        try:
            body = json.dumps({"t": "value", "value": "not codec text ["}).encode()
            os.write(fd, len(body).to_bytes(4, "big") + body)
        except OSError:
            pass
    return 1
'''
    outcome = run(lambda nb: fetch(nb.forge()), program)
    assert outcome.reason == "the submission's process sent a malformed reply"


# --- isolation ------------------------------------------------------------------------------

def _mode() -> str:
    return judge._server().mode


def test_the_worker_has_its_own_uid_and_sees_only_what_grading_needs():
    if not judge._server().info["own_uid"]:
        pytest.skip("needs root")
    repo = str(judge.REPO_ROOT)
    program = f'''
import os
uid = os.getuid()
absent = [p for p in ("grader/hidden/__init__.py", "grader/api.py", "tests", "solutions", "course", ".git")
          if not os.path.exists(os.path.join({repo!r}, p))]
present = [p for p in ("coursekit/checks.py", "grader/probes/__init__.py", "grader/probes/shared.py",
                       "grader/probes/ch10_flash_attention.py")
           if os.path.exists(os.path.join({repo!r}, p))]
'''

    def check(nb):
        assert fetch(nb.uid) >= UID_BASE
        if _mode() == "chroot":
            assert len(fetch(nb.absent)) == 6
            assert fetch(nb.present) == ["coursekit/checks.py", "grader/probes/__init__.py", "grader/probes/shared.py",
                                         "grader/probes/ch10_flash_attention.py"]

    assert run(check, program).passed


def test_denials_that_libraries_trigger_on_their_own_do_not_fail_the_problem():
    program = '''
import threading
results = []
for attempt in (lambda: open("/etc/hostname").read(),
                lambda: __import__("yaml"),
                lambda: threading.Thread(target=print).start()):
    try:
        attempt()
        results.append("allowed")
    except (PermissionError, ImportError) as e:
        results.append(type(e).__name__)
'''

    def check(nb):
        assert fetch(nb.results) == ["Denied", "DeniedImport", "Denied"]

    assert run(check, program).passed


def test_serious_denials_fail_the_problem_even_when_caught():
    program = "try:\n    open(os.path.join(os.path.dirname(torch.__file__), '..', '..', '..', '..', '..', " \
              "'..', 'grader', 'api.py'))\nexcept Exception:\n    pass\ntry:\n    os.kill(1, 0)\n" \
              "except Exception:\n    pass"
    outcome = run(lambda nb: None, program)
    assert not outcome.passed
    assert outcome.reason.startswith("your code tried to ")


def test_probes_refuse_to_run_on_a_tampered_process():
    program = "nn.Module.__call__ = lambda self, *a, **k: self.forward(*a, **k)\nlayer = nn.Linear(2, 2)"
    outcome = run(lambda nb: nb.apply(probes.param_table, nb.layer), program)
    assert outcome.reason == ("your code tried to replace torch.nn.modules.module.Module.__call__ "
                              "(the grader relies on it), which is not allowed during grading")


HONEST = '''
import collections, dataclasses, enum, json, logging, pathlib, tempfile, typing, warnings
import numpy as np
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from tqdm.auto import trange
import matplotlib.pyplot as plt
from coursekit import measure, model_state_bytes

@dataclasses.dataclass
class Config:
    width: int = 8
    depth: int = 3

Pair = collections.namedtuple("Pair", "a b")
T = typing.TypeVar("T")

class Kind(enum.Enum):
    A = 1

class Relu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * (x > 0)

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return checkpoint(lambda t: Relu.apply(self.lin(t)), x, use_reentrant=False)

class Net(nn.Module):
    def __init__(self, cfg=Config()):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(cfg.width) for _ in range(cfg.depth)])

    def forward(self, x):
        return self.blocks(x)

def train(steps):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in trange(steps):
        loss = net(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()

warnings.warn("honest code warns sometimes")
logging.getLogger("course").warning("and logs")
fig, ax = plt.subplots()
ax.plot([1, 2, 3])
fig.savefig("figure.png")
plt.close(fig)
torch.save(Net().state_dict(), "checkpoint.pt")
state = torch.load("checkpoint.pt")
np.save("array.npy", np.arange(3))
pathlib.Path("notes.txt").write_text(json.dumps({"ok": True}))
with tempfile.TemporaryDirectory() as d:
    pathlib.Path(d, "x").write_text("x")
saved = measure(lambda: Net()(torch.randn(4, 8)).sum()).saved_bytes
'''


def test_honest_course_code_runs_without_denials():
    def check(nb):
        assert fetch(nb.saved) > 0
        assert fetch(nb.train(3)) > 0
        net = nb.Net()
        x, g = torch.randn(4, 8), torch.randn(4, 8)
        measured = nb.apply(probes.measure_forward_backward, net, x, g)
        assert measured["forward_flops"] == 3 * 2 * 4 * 8 * 8
        result = nb.apply(probes.forward_backward, net, x, g)
        assert set(result["grads"]) == {f"blocks.{i}.lin.{p}" for i in range(3) for p in ("weight", "bias")}
        assert "blocks.0" in nb.apply(probes.module_table, net)

    assert run(check, HONEST) == judge.Outcome("test_x", True, "")


def test_the_worker_starts_in_an_empty_directory_of_its_own():
    """Nothing of the submission's folder reaches the worker: only the exercise cells' source runs."""
    def check(nb):
        assert fetch(nb.listing) == [".output"]

    assert run(check, "listing = sorted(os.listdir('.'))").passed


def test_workers_are_killed_and_cleaned_up_even_on_keyboard_interrupt():
    seen = {}

    def check(nb):
        seen["pid"] = nb._worker.pid
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(check, "x = 1")
    with pytest.raises(ProcessLookupError):
        os.kill(seen["pid"], 0)


def test_plain_mode_removes_worker_directories(monkeypatch):
    server = judge._server("plain")
    base = Path(server.info["work_base"])
    monkeypatch.setattr(judge, "_server", lambda mode=None: server)
    assert run(lambda nb: None, "open('junk', 'w').write('x' * 1000)").passed
    assert list(base.iterdir()) == []


def test_policy_rules_cover_the_course_packages():
    rules = policy.rules_for("/tmp/w1", str(judge.REPO_ROOT), ())
    assert rules.workdir == "/tmp/w1"
    assert {"torch", "numpy", "coursekit", "math", "dataclasses"} <= rules.modules
    assert not {"ctypes", "socket", "subprocess", "grader", "sqlite3"} & rules.modules
    assert any(r.endswith("site-packages") for r in rules.code_roots)
    assert str(judge.REPO_ROOT / "coursekit") in rules.code_roots


def test_the_chapters_declared_imports_extend_the_base_set():
    """kernels and triton are importable because chapters declare them (grader.chapters), which
    grader.api hands the sandbox; a module no chapter declares stays out."""
    from grader.chapters import declared_imports
    from grader.sandbox import settings

    assert {"kernels", "triton"} <= declared_imports() == settings.extra_modules()
    assert not {"kernels", "triton"} & policy.rules_for("/tmp/w1", str(judge.REPO_ROOT), ()).modules
    rules = policy.rules_for("/tmp/w1", str(judge.REPO_ROOT), (), settings.extra_modules())
    assert {"kernels", "triton", "torch"} <= rules.modules
    assert "socket" not in policy.rules_for("/tmp/w1", str(judge.REPO_ROOT), (), frozenset({"socket"})).modules


def test_signals_are_refused_and_reported():
    reason = run(lambda nb: nb.die(), "def die():\n    os.kill(os.getpid(), 9)").reason
    # os.kill is refused (a signal), so the process lives and the attempt is reported.
    assert reason == "your code tried to send a signal (os.kill), which is not allowed during grading"


def test_hidden_test_objects_are_never_sent_to_the_worker():
    hidden = checks_for(toy.CHAPTER)["test_scaled_sum"]

    def check(nb):
        with pytest.raises(TypeError, match="cannot be sent"):
            nb.apply(probes.raised, hidden, None)
        with pytest.raises(TypeError, match="cannot be sent"):
            nb.put([1, {"f": hidden}])

    assert run(check).passed


def test_reasons_keep_only_printable_text():
    reason = run(lambda nb: nb.shout(), "def shout():\n    raise ValueError('\\x1b[31mred\\x00')").reason
    assert reason == "your code raised ValueError: ?[31mred? (calling shout)"


def test_too_small_a_memory_limit_is_a_configuration_error():
    with pytest.raises(ValueError, match="memory_bytes must be at least"):
        run(lambda nb: None, limits=judge.Limits(memory_bytes=64 * 1024**2))


def test_closing_the_pipes_is_reported_as_such():
    program = "def hang_up():\n    for fd in range(3, 32):\n        try:\n            os.close(fd)\n" \
              "        except OSError:\n            pass\n    import time\n    time.sleep(30)"
    reason = run(lambda nb: nb.hang_up(), program).reason
    assert reason == "your code's process stopped answering the grader (it closed its pipes)"


def test_the_strongest_isolation_mode_starts():
    """A machine that can chroot must grade in chroot mode, not fall back quietly to a weaker one."""
    from grader.sandbox import supervisor

    modes = supervisor.isolation_modes()
    assert judge._server().mode == modes[0], f"the sandbox fell back from {modes[0]!r}"


# --- concurrent grading threads ----------------------------------------------------------------
def test_checks_in_parallel_threads_keep_their_seeded_global_rng_draws():
    """autograde --workers N runs checks in threads of one judge: a check that seeds torch's global
    RNG right before a reference that draws from it (dropout) must see its own stream, even while
    other checks run; the judge lock lets go only while a check waits for its worker."""
    from concurrent.futures import ThreadPoolExecutor

    def check(nb):
        for seed in range(30):
            fetch(nb.scaled_sum(nb.put(torch.ones(3)), 1.0))  # a round trip: the lock is let go here
            torch.manual_seed(seed)
            drawn = torch.nn.functional.dropout(torch.ones(2000), 0.5)
            torch.manual_seed(seed)
            assert torch.equal(drawn, torch.nn.functional.dropout(torch.ones(2000), 0.5)), "RNG stream interleaved"

    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(lambda _: run(check, toy.SOLUTION), range(3)))
    assert all(o.passed for o in outcomes), [o.reason for o in outcomes]


def test_the_judge_lock_is_let_go_while_waiting_for_a_worker():
    import threading

    from grader.sandbox import rpc

    entered = threading.Event()

    def other():
        with rpc.judging():
            entered.set()

    with rpc.judging():
        with rpc.waiting_for_worker():
            t = threading.Thread(target=other)
            t.start()
            assert entered.wait(10), "another check could not run while this one waited for its worker"
            t.join()


def test_checks_that_read_the_baseline_footprint_at_once_do_not_deadlock():
    """Checks asking for the baseline's footprint at the same time, as `autograde --workers 2`
    does: the first one waits for its baseline worker with the judge lock let go, and the next one,
    holding the judge lock, must not then wait for the first one's footprint lock (a batch that
    did so stopped for good). The baseline's setup cell sleeps, so the checks meet in that window."""
    import threading
    import time

    judge._BASELINE_HELD.clear()
    setup = SETUP + "import time\ntime.sleep(2)\n"
    outcomes = []

    def check(nb):
        assert nb.baseline_held() >= 0

    def grade():
        outcomes.append(judge._run_one("test_x", check, [setup, "x = 1\n"], LIMITS, setup=1, baseline=["x = 2\n"]))

    threads = [threading.Thread(target=grade, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "checks reading the baseline footprint deadlocked"
    assert len(outcomes) == 3 and all(o.passed for o in outcomes), [o.reason for o in outcomes]
