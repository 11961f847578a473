"""When selection runs (leanbatch.selection.schedule): Composer's window and interrupt rule, and progress."""

from __future__ import annotations

import pytest

from leanbatch import SelectiveBackprop, should_selective_backprop, training_progress


def test_interrupt_semantics_match_composer_code() -> None:
    sb = SelectiveBackprop(start=0.5, end=0.9, interrupt=3)
    assert [sb.is_active(0.6, i) for i in range(6)] == [True, True, False, True, True, False]
    assert [SelectiveBackprop(interrupt=2).is_active(0.6, i) for i in range(4)] == [True, False, True, False]
    assert all(SelectiveBackprop(interrupt=0).is_active(0.6, i) for i in range(5))
    assert not sb.is_active(0.49, 0) and sb.is_active(0.5, 0) and not sb.is_active(0.9, 0)
    assert not SelectiveBackprop(keep=1.0).is_active(0.6, 0)  # keep=1: nothing to select
    with pytest.warns(UserWarning, match="interrupt=1"):
        never = SelectiveBackprop(interrupt=1)
    assert not any(never.is_active(0.6, i) for i in range(5))
    # the whole (progress, batch) table, written out: window [0.5, 0.9), every third batch vanilla
    on = [True, True, False, True, True, False, True]
    off = [False] * 7
    expected = {0.0: off, 0.3: off, 0.4999: off, 0.5: on, 0.7: on, 0.8999: on, 0.9: off, 0.95: off}
    assert {p: [sb.is_active(p, i) for i in range(7)] for p in expected} == expected
    assert {p: [should_selective_backprop(p, i, 0.5, 0.9, 3) for i in range(7)] for p in expected} == expected
    rank_keep1 = SelectiveBackprop(keep=1.0, interrupt=0)
    history_keep1 = SelectiveBackprop(keep=1.0, interrupt=0, rule="history")  # keep does not apply to it
    assert [rank_keep1.is_active(0.6, i) for i in range(3)] == [False] * 3
    assert [history_keep1.is_active(0.6, i) for i in range(3)] == [True] * 3


def test_training_progress_from_epochs_or_steps() -> None:
    assert training_progress(epoch=2, num_epochs=4) == 0.5
    assert training_progress(epoch=2, num_epochs=4, batch_idx=5, batches_per_epoch=10) == 0.625
    assert training_progress(step=30, total_steps=40) == 0.75
    with pytest.raises(TypeError):
        training_progress(step=3)
