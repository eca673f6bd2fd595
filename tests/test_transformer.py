"""TinyGPT, the synthetic token tasks and the shipped checkpoint."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import coursekit.checkpoints as checkpoints
from coursekit.checkpoints import PRETRAINED, checkpoint_path, load_pretrained
from coursekit.data import TaskConfig, batches, make_task, source_task, target_task
from coursekit.transformer import GPTConfig, TinyGPT, accuracy, lm_loss


def test_shapes_and_parameter_names():
    cfg = GPTConfig(vocab_size=11, context=9, d_model=24, n_heads=3, n_layers=3)
    model = TinyGPT(cfg)
    idx = torch.randint(0, 11, (4, 7))
    assert model(idx).shape == (4, 7, 11)
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for i in range(3):
        assert {f"blocks.{i}.{name}" for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")} <= linears
    assert "lm_head" in linears
    assert "blocks.0.attn.mask" not in model.state_dict(), "the causal mask is derived, not stored"


def test_bad_config_and_long_input_are_refused():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="context"):
        TinyGPT(GPTConfig(context=8))(torch.zeros(1, 9, dtype=torch.long))


def test_causality():
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=16, context=32, n_layers=2)).eval()
    idx = torch.randint(0, 16, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 5) % 16  # rewrite the future from position 12 on
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=0)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3, "later positions must see the change"


def test_gradient_of_an_early_output_ignores_later_tokens():
    torch.manual_seed(1)
    model = TinyGPT(GPTConfig(vocab_size=16, context=16, n_layers=2))
    emb = model.tok_emb(torch.randint(0, 16, (1, 10))).detach().requires_grad_(True)
    x = emb + model.pos_emb(torch.arange(10))
    for block in model.blocks:
        x = block(x)
    x[0, 4].sum().backward()
    assert emb.grad[0, 5:].abs().max() == 0 and emb.grad[0, :5].abs().max() > 0


def test_tasks_are_deterministic_and_follow_their_rule():
    cfg = TaskConfig(vocab_size=16, length=32, noise=0.2)
    a, b = source_task(50, seed=3, cfg=cfg), source_task(50, seed=3, cfg=cfg)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, source_task(50, seed=4, cfg=cfg).x)
    assert a.x.shape == a.y.shape == (50, 32)
    for task, k in ((a, 1), (target_task(50, seed=3, cfg=cfg), 2)):
        s = torch.cat([task.x, task.y[:, -1:]], dim=1)  # the last target is the token after x
        scored = task.y != -100
        assert not scored[:, 0].any(), "the second token has one predecessor only: never scored"
        t = torch.nonzero(scored)
        prev1, prev2 = s[t[:, 0], t[:, 1]], s[t[:, 0], t[:, 1] - 1]
        assert torch.equal(task.y[scored], s[:, 1:][scored]), "a target is the next token"
        assert torch.equal(task.y[scored], (k * prev1 + prev2) % 16)
        assert 0.7 < scored[:, 1:].float().mean() < 0.9, "about 80% of the tokens follow the rule"


def test_make_task_and_batches_validate_their_arguments():
    with pytest.raises(ValueError, match="unknown rule"):
        make_task("tribonacci", 4, 0)
    with pytest.raises(ValueError, match="batch_size"):
        next(batches(source_task(4, 0), 5, 1))
    xs = [x for x, _ in batches(source_task(40, 0), 8, 3, seed=1)]
    assert len(xs) == 3 and all(x.shape == (8, 32) for x in xs)


@pytest.mark.parametrize("name", sorted(PRETRAINED))
def test_checkpoint_is_small_and_plain_tensors(name):
    path = checkpoint_path(name)
    assert path.stat().st_size < 2 * 1024**2
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    assert set(state) == set(TinyGPT(PRETRAINED[name].model).state_dict())


@pytest.mark.parametrize("name", sorted(PRETRAINED))
def test_checkpoint_solves_the_source_task_and_not_the_target(name):
    spec = PRETRAINED[name]
    model = load_pretrained(name)
    assert all(p.requires_grad for p in model.parameters())
    src = source_task(300, seed=999, cfg=spec.task)
    tgt = target_task(300, seed=999, cfg=spec.task)
    assert accuracy(model, src.x, src.y) >= spec.min_accuracy
    assert accuracy(model, tgt.x, tgt.y) < 0.2, "the target task must be new to the pretrained model"
    assert model.training, "accuracy() restores train mode"
    loss = lm_loss(model(src.x[:8]), src.y[:8])
    assert loss.item() < 0.1


def test_missing_checkpoint_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="make checkpoints"):
        load_pretrained("tinygpt_fibonacci")
    with pytest.raises(ValueError, match="unknown checkpoint"):
        load_pretrained("gpt5")
