"""Unit tests of the grader's building blocks: codec, hidden-test API, notebook parsing."""
import nbformat
import pytest
import torch
from torch import nn

from grader import probes
from grader.api import LocalNamespace, fetch
from grader.notebooks import Layout, defines, exercise_sources, layout
from grader.sandbox.codec import NotTransferable, decode, encode


def test_codec_round_trips_plain_data():
    value = {"t": torch.randn(3, 5), "h": torch.randn(2).half(), "b": torch.randn(4).bfloat16(),
             "i": torch.arange(6).reshape(2, 3), "m": torch.tensor([True, False]), "e": torch.zeros(0, 2),
             "nested": [1, 2.5, None, "s", (True, float("inf"), float("nan"))], "dtype": torch.float16,
             "size": torch.Size([2, 3]), "big": 2**80}
    out = decode(encode(value))
    for k in ("t", "h", "b", "i", "m", "e"):
        assert out[k].dtype == value[k].dtype and torch.equal(out[k], value[k])
    assert out["nested"][:4] == [1, 2.5, None, "s"] and isinstance(out["nested"][4], tuple)
    assert out["dtype"] is torch.float16 and out["size"] == torch.Size([2, 3]) and out["big"] == 2**80


def test_codec_round_trips_scalars():
    for t in (torch.tensor(3.5), torch.tensor(7), torch.tensor(True), torch.tensor(1.5).bfloat16()):
        out = decode(encode(t))
        assert out.shape == () and out.dtype == t.dtype and torch.equal(out, t)


def test_codec_sends_non_contiguous_views_as_values():
    x = torch.randn(4, 6)
    assert torch.equal(decode(encode(x.t())), x.t())


@pytest.mark.parametrize("value", [nn.Linear(2, 2), lambda: 1, object(), {1: 2}, torch.randn(2, dtype=torch.complex64)])
def test_codec_refuses_objects(value):
    with pytest.raises(NotTransferable):
        encode(value)


@pytest.mark.parametrize("text", ["[", '{"__tensor__": "torch.float32", "shape": [3], "data": "AAAA"}',
                                  '{"__tensor__": "os.system", "shape": [], "data": ""}', '{"__evil__": 1}',
                                  '{"__dict__": 5}', "[" * 100 + "]" * 100])
def test_codec_rejects_malformed_input(text):
    with pytest.raises(ValueError):
        decode(text)


def test_fetch_copies_local_values():
    t = torch.ones(2, requires_grad=True)
    got = fetch({"t": t * 2})
    assert not got["t"].requires_grad and torch.equal(got["t"], torch.full((2,), 2.0))
    with pytest.raises(NotTransferable):
        fetch(nn.Linear(1, 1))


def test_local_namespace():
    ns = LocalNamespace({"f": lambda x: x + 1})
    assert ns.f(1) == 2 and ns["f"](2) == 3
    with pytest.raises(NameError, match="does not define 'g'"):
        ns.g
    assert ns.put(5) == 5 and ns.apply(probes.type_names, 1)[0] == "builtins.int"


def test_probes():
    assert probes.raised(int, "x")[0] == "ValueError" and probes.raised(int, "1") is None
    lin = nn.Linear(3, 2)
    lin.bias.requires_grad_(False)
    table = probes.param_table(lin)
    assert table["weight"]["requires_grad"] and not table["bias"]["requires_grad"]
    out = probes.forward_backward(lin, torch.randn(4, 3), torch.ones(4, 2))
    assert out["dx"].shape == (4, 3) and out["grads"]["bias"] is None


def test_the_probe_package_has_a_module_per_chapter_and_exports_all_they_define():
    """grader/probes/ mirrors grader/hidden/; every module is imported and its names re-exported."""
    from pathlib import Path

    import grader

    root = Path(grader.__file__).parent
    files = sorted(f.stem for f in (root / "probes").glob("*.py") if f.stem != "__init__")
    assert list(probes.MODULES) == [f"grader.probes.{f}" for f in files]
    hidden = {f.stem for f in (root / "hidden").glob("ch*.py")}
    assert set(files) - {"shared"} <= hidden, "a probe module is named like a chapter's hidden tests"
    for name in probes.MODULES:
        module = vars(probes)[name.rpartition(".")[2]]
        for attr, value in vars(module).items():
            if getattr(value, "__module__", None) == name and not attr.startswith("__"):
                assert getattr(probes, attr) is value, f"grader.probes.{attr}"
    assert probes.ch03_MicroBatchModel.__module__ == "grader.probes.ch03_accumulation"
    assert probes._ch10_changed(probes._CH10_INTERPRETER) is None


def test_the_sandbox_trusts_exactly_the_public_probes_of_the_package():
    from grader import api
    from grader.sandbox import trusted

    table = trusted.probe_table(api.PROBES)
    public = {attr for name in probes.MODULES for attr, value in vars(vars(probes)[name.rpartition(".")[2]]).items()
              if callable(value) and getattr(value, "__module__", None) == name and not attr.startswith("_")}
    assert set(table) == public and {"raised", "ch03_MicroBatchModel", "ch10_triton_run"} <= public
    assert all(table[name] is getattr(probes, name) for name in table)
    for name, fn in table.items():
        assert trusted.probe_name(fn, api.PROBES) == name
    for not_a_probe in (probes._ch10_trace, probes.shared.measure, api.checks_for, torch.add, lambda: 1):
        assert trusted.probe_name(not_a_probe, api.PROBES) is None, not_a_probe
    assert trusted.probe_name(probes.raised, None) is None
    assert trusted.may_travel("grader.probes.ch03_accumulation", api.PROBES)
    assert trusted.may_travel("torch.nn.modules.linear", api.PROBES) and trusted.may_travel("grader.sandbox.codec", None)
    for refused in ("grader.hidden.ch01_lora", "grader.api", "__main__"):
        assert not trusted.may_travel(refused, api.PROBES), refused


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    return nb


def test_exercise_sources_by_grade_id_then_by_name():
    tagged = nbformat.v4.new_code_cell("def f():\n    return 1", metadata={"nbgrader": {"grade_id": "f", "solution": True}})
    untagged = nbformat.v4.new_code_cell("def g():\n    return 2")
    found = exercise_sources(_nb([tagged, untagged]), ("f", "g", "h"))
    assert found == {"f": "def f():\n    return 1", "g": "def g():\n    return 2", "h": None}


def test_defines():
    assert defines("class A:\n    pass", "A") and defines("A = 1", "A")
    assert not defines("def B(): pass", "A") and not defines("def (", "A")


def test_layout_reads_roles():
    cells = [nbformat.v4.new_code_cell("import torch", metadata={"tags": ["setup"]}),
             nbformat.v4.new_code_cell("x = 1"),
             nbformat.v4.new_code_cell("def f(): ...", metadata={"nbgrader": {"grade_id": "f", "solution": True}}),
             nbformat.v4.new_code_cell("assert f", metadata={"checks": "f", "nbgrader": {"grade_id": "test_f", "grade": True,
                                                                                         "points": 2}})]
    lay = layout(_nb(cells), "chX")
    assert lay == Layout("chX", ("import torch",), ("f",), (("test_f", 2.0),), (("f", ("test_f",)),))
    assert lay.tests_of("f") == ("test_f",) and lay.tests_of("g") == ()


def test_layout_pairs_each_test_cell_with_the_exercise_it_names():
    def ex(name):
        return nbformat.v4.new_code_cell("", metadata={"nbgrader": {"grade_id": name, "solution": True}})

    def test(name, checks):
        return nbformat.v4.new_code_cell("", metadata={"checks": checks,
                                                       "nbgrader": {"grade_id": name, "grade": True, "points": 1}})

    cells = [ex("a"), test("t1", "a"), nbformat.v4.new_code_cell("x = 1"), ex("b"), test("t2", "a"), ex("c"),
             test("t3", "c")]
    lay = layout(_nb(cells), "chX")
    assert lay.exercise_tests == (("a", ("t1", "t2")), ("b", ()), ("c", ("t3",)))
    with pytest.raises(ValueError, match="test cell 't0' checks 'a', which is not an exercise before it"):
        layout(_nb([test("t0", "a"), ex("a")]), "chX")
    with pytest.raises(ValueError, match="checks None"):
        layout(_nb([ex("a"), test("t0", None)]), "chX")
