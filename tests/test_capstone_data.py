"""The shipped capstone data (data/capstone/, written by ``make capstone-data``) is what the course's code measures.

Re-deriving the whole table takes minutes (a fine-tune per combination of the quality knobs); here a few rows are
measured again (bytes and FLOPs are exact on CPU) and the profile's first kind is recomputed."""
from __future__ import annotations

import pytest
import torch

import coursekit.capstone as cap

ROWS = [cap.Config(), cap.Config(8, True, "lora", True, 2, 0.5), cap.Config(16, False, "paca", False, 2, 0.25)]


def test_ch16_table_covers_the_grid_in_order():
    table = cap.load_table()
    assert [cap.config_of(r) for r in table] == list(cap.grid())
    for r in table:
        assert r["bytes"] > 0 and r["flops"] > 0 and 0 <= r["accuracy"] <= 1
    keys = {}
    for r in table:  # accuracy depends only on the quality knobs
        assert keys.setdefault(cap.quality_key(cap.config_of(r)), r["accuracy"]) == r["accuracy"]


@pytest.mark.parametrize("config", ROWS, ids=["full", "lora-nf4-ckpt-2bit-drop", "paca-2bit-drop"])
def test_ch16_rows_are_measured_again(config):
    torch.set_num_threads(1)
    row = {cap.config_of(r): r for r in cap.load_table()}[config]
    got = cap.measured(config)
    assert (got["bytes"], got["flops"]) == (row["bytes"], row["flops"])


def test_ch16_profile_state_is_what_the_model_holds():
    profile = cap.load_profile()
    for kind, (method, nf4) in {"lora": ("lora", False), "paca+nf4": ("paca", True), "full": ("full", False)}.items():
        model = cap.configured_model(cap.Config(method=method, nf4=nf4))
        train = sum(p.numel() * p.element_size() for p in cap.trainable(model))
        assert profile["kinds"][kind]["trainable_bytes"] == train
        assert profile["kinds"][kind]["stored_bytes"] == cap.state_bytes(model) - 3 * train


def test_ch16_micro_batching_and_checkpointing_do_not_change_the_update():
    """The rule that lets the table train once per quality combination, checked on one pair."""
    from coursekit.data import target_task

    batch = target_task(cap.GLOBAL_BATCH, 7)
    steps = [cap.training_step(cap.Config(32, False, "paca", False, 32, 0.25)),
             cap.training_step(cap.Config(4, True, "paca", False, 32, 0.25))]
    for s in steps:
        for _ in range(2):
            s((batch.x, batch.y))
    for a, b in zip(cap.trainable(steps[0].model), cap.trainable(steps[1].model)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)  # summation order only
