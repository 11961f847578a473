"""Resuming a leanbatch Trainer run from a checkpoint equals the uninterrupted run.

Two checkpoints: one inside a pruned epoch where the Trainer's own guess of the epoch
(``global_step // steps_per_full_epoch``) is wrong, one at the end of an epoch followed by a
pruned one; InfoBatch and Selective Backprop stacked, gradient accumulation on.
"""

from __future__ import annotations

import os

import pytest
import torch
from hf_setup import PadCollator, Trace, instruction_data, params, tiny_model, training_args

from leanbatch import InfoBatch, SelectiveBackprop
from leanbatch.hf import STATE_FILE, LeanBatchTrainer

N, EPOCHS, GA = 40, 5, 2
STEPS_PER_FULL_EPOCH = 5  # 10 batches of 4, 2 per step


def _run(out: str, model_seed: int, resume: str | None = None):
    data = instruction_data(N, seed=5)
    ds = InfoBatch(data, EPOCHS, prune_ratio=0.8, delta=0.8, seed=11, shard=False)
    sb = SelectiveBackprop(start=0.3, end=0.8, keep=0.5, scale_factor=1.0, interrupt=2, seed=2)
    trace = Trace()
    args = training_args(
        out,
        num_train_epochs=EPOCHS,
        gradient_accumulation_steps=GA,
        warmup_steps=2,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=1,
    )
    trainer = LeanBatchTrainer(
        model=tiny_model(model_seed),
        args=args,
        train_dataset=ds,
        data_collator=PadCollator(),
        selective_backprop=sb,
        callbacks=[trace],
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, trace


def test_resume_mid_epoch_or_at_its_end_equals_the_uninterrupted_run(tmp_path):
    full, full_trace = _run(str(tmp_path / "full"), model_seed=0)
    ds, sb = full.infobatch, full.selective_backprop
    assert [s["pruning"] for s in ds.epoch_stats] == [False, True, True, True, False]
    assert sb.stats.selected_batches > 0
    assert full.state.epoch == EPOCHS and full.lr_scheduler.get_last_lr()[0] == 0.0
    # a checkpoint inside a pruned epoch at which the Trainer's epoch guess is wrong
    epochs = {h["step"]: h["epoch"] for h in full.state.log_history if "loss" in h}
    mid = [
        s
        for s, e in sorted(epochs.items())
        if e != int(e) and ds.epoch_stats[int(e)]["pruning"] and s // STEPS_PER_FULL_EPOCH != int(e)
    ]
    assert mid, epochs
    # and the end of an epoch followed by a pruned one (the checkpoint's epoch is finished)
    boundary = [
        s
        for s, e in sorted(epochs.items())
        if e == int(e) and 0 < e < EPOCHS and ds.epoch_stats[int(e)]["pruning"]
    ]
    assert boundary, epochs
    saved = torch.load(
        os.path.join(str(tmp_path / "full"), f"checkpoint-{mid[0]}", STATE_FILE), weights_only=True
    )
    assert saved["infobatch"]["sampler"]["position"] > 0 and saved["selective_backprop"]["draws"] > 0

    def logged_after(trainer, step):
        return [(h["step"], h["loss"], h["learning_rate"]) for h in trainer.state.log_history if "loss" in h][
            step:
        ]

    for step in (mid[0], boundary[-1]):
        ckpt = os.path.join(str(tmp_path / "full"), f"checkpoint-{step}")
        resumed, resumed_trace = _run(str(tmp_path / f"resumed-{step}"), model_seed=1, resume=ckpt)
        rds, rsb = resumed.infobatch, resumed.selective_backprop
        assert resumed.state.global_step == full.state.global_step
        assert resumed.state.epoch == EPOCHS
        torch.testing.assert_close(params(resumed.model), params(full.model), rtol=0, atol=0)
        torch.testing.assert_close(rds.scores.values, ds.scores.values, rtol=0, atol=0, equal_nan=True)
        assert rds.epoch_stats == ds.epoch_stats
        assert rsb.state_dict() == sb.state_dict()
        assert logged_after(resumed, step) == logged_after(full, step) and len(logged_after(full, step)) > 3
        assert resumed_trace.lrs == full_trace.lrs[step:]
        assert resumed_trace.epochs == [float(e) for e in range(int(epochs[step]) + 1, EPOCHS + 1)]


def test_resume_needs_the_leanbatch_state(tmp_path):
    full, _ = _run(str(tmp_path / "full"), model_seed=0)
    ckpt = os.path.join(str(tmp_path / "full"), f"checkpoint-{full.state.global_step}")
    os.remove(os.path.join(ckpt, STATE_FILE))
    with pytest.raises(FileNotFoundError, match="leanbatch_state.pt"):
        _run(str(tmp_path / "again"), model_seed=0, resume=ckpt)
