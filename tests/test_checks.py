"""coursekit.checks: failures say what differs, where, by how much, and what to revisit."""
import pytest
import torch

from coursekit.checks import check_close, check_equal, check_gradients


def test_check_close_passes_within_tolerance():
    x = torch.randn(37, 53)
    check_close(x + 1e-7, x, "y")


def test_check_close_reports_location_error_and_hint():
    x = torch.zeros(3, 4)
    y = x.clone()
    y[2, 1] = 0.5
    with pytest.raises(AssertionError) as info:
        check_close(y, x, "dA", hint="is the update scaled by alpha / rank?")
    msg = str(info.value)
    assert "dA differs from the reference" in msg and "(2, 1)" in msg and "0.5" in msg
    assert msg.endswith("is the update scaled by alpha / rank?")


@pytest.mark.parametrize("actual,expected,phrase", [
    (torch.zeros(2, 3), torch.zeros(3, 2), "has shape (2, 3), expected (3, 2)"),
    (torch.zeros(2), torch.zeros(2, dtype=torch.float64), "has dtype torch.float32"),
    ([0.0, 0.0], torch.zeros(2), "should be a tensor"),
    (torch.tensor([float("nan")]), torch.tensor([1.0]), "differs"),
])
def test_check_close_explains_mismatches(actual, expected, phrase):
    with pytest.raises(AssertionError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        check_close(actual, expected, "x")


def test_check_equal():
    check_equal({"a": 1}, {"a": 1}, "result")
    with pytest.raises(AssertionError, match="result is 3, expected 4. Count the bias too."):
        check_equal(3, 4, "result", "Count the bias too.")


def test_check_gradients_accepts_equal_functions_and_catches_a_wrong_gradient():
    w = torch.randn(5, 3)
    x = torch.randn(4, 5, requires_grad=True)
    check_gradients(lambda x: x @ w, lambda x: x @ w, [x], ["x"])

    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x @ w

        @staticmethod
        def backward(ctx, g):
            return 2 * g @ w.T  # twice the true gradient

    with pytest.raises(AssertionError, match="the gradient of x differs"):
        check_gradients(WrongBackward.apply, lambda x: x @ w, [x], ["x"], hint="check the backward")

    detached = lambda x: (x.detach() @ w).requires_grad_()  # noqa: E731 - cut from the graph
    with pytest.raises(AssertionError, match="no gradient reached x"):
        check_gradients(detached, lambda x: x @ w, [x], ["x"])
