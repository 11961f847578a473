"""The selection forward (leanbatch.selection.scoring): training state untouched, chunking, precision,
token models, and inputs it cannot downsample."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from selection_helpers import (
    CountingModel,
    TinyLM,
    assert_same_state,
    cnn,
    snapshot,
)

from leanbatch import SelectiveBackprop, per_sequence_loss, select_using_loss, selection_losses


@pytest.mark.parametrize("eval_mode", [False, True])
@pytest.mark.parametrize("frozen_bn", [False, True])
def test_selection_leaves_bn_statistics_modes_and_grads_untouched(eval_mode: bool, frozen_bn: bool) -> None:
    torch.manual_seed(0)
    model = cnn(dropout=0.1).train()
    if frozen_bn:
        model[1].eval()  # a frozen BatchNorm layer must stay frozen
    X, y = torch.randn(32, 1, 16, 16) * 3 + 1, torch.randint(0, 10, (32,))
    model(X)  # non-trivial running statistics
    snap = snapshot(model)
    X_new, y_new = select_using_loss(
        X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5, eval_mode=eval_mode
    )
    assert_same_state(model, snap)
    assert all(p.grad is None for p in model.parameters())
    assert not X_new.requires_grad
    losses = selection_losses(X, y, model, F.cross_entropy, 0.5, chunk_size=5, eval_mode=eval_mode)
    assert losses.shape == (32,) and losses.dtype == torch.float32 and not losses.requires_grad
    assert_same_state(model, snap)
    model.eval()
    snap = snapshot(model)
    select_using_loss(X, y, model, F.cross_entropy, keep=0.5)
    assert_same_state(model, snap)


def test_selective_backprop_object_leaves_state_untouched_including_first_call_check() -> None:
    torch.manual_seed(0)
    model = cnn().train()
    batch = (torch.randn(16, 1, 12, 12), torch.randint(0, 10, (16,)))
    model(batch[0])
    snap = snapshot(model)
    sb = SelectiveBackprop(interrupt=0)
    for progress in (0.1, 0.6):  # the first call runs the dry check even outside the window
        sb.select(batch, model, F.cross_entropy, progress=progress, batch_idx=0)
        assert_same_state(model, snap)


def test_chunked_losses_equal_unchunked_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = cnn().eval()
    X, y = torch.randn(23, 1, 10, 10), torch.randint(0, 10, (23,))
    whole = selection_losses(X, y, model, F.cross_entropy)
    chunked = selection_losses(X, y, model, F.cross_entropy, chunk_size=4)
    assert torch.allclose(whole, chunked, atol=1e-5)


def test_selection_runs_under_the_requested_precision() -> None:
    seen: list[torch.dtype] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.lin(x)
            seen.append(out.dtype)
            return out

    X, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    select_using_loss(X, y, Probe(), F.cross_entropy, keep=0.5, autocast=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        select_using_loss(X, y, Probe(), F.cross_entropy, keep=0.5)  # inherits the caller's context
        select_using_loss(X, y, Probe(), F.cross_entropy, keep=0.5, autocast=False)
    assert seen == [torch.bfloat16, torch.bfloat16, torch.float32]


def test_dict_batch_with_token_labels() -> None:
    torch.manual_seed(0)
    n, t = 12, 7
    ids = torch.randint(0, 11, (n, t))
    mask = torch.ones(n, t, dtype=torch.long)
    labels = ids.clone()
    labels[:, :2] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels, "source": "toy"}
    sb = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0)
    out = sb.select(batch, TinyLM(), per_sequence_loss, progress=0.6, batch_idx=0)
    assert set(out.batch) == set(batch) and out.batch["source"] == "toy"
    assert out.batch["input_ids"].shape == (6, t) and out.losses is not None and out.losses.shape == (n,)
    assert out.positions is not None
    assert torch.equal(out.batch["labels"], labels[out.positions])
    assert torch.equal(out.batch["input_ids"], ids[out.positions])


def test_dict_batch_rejects_downsampling_on_first_call() -> None:
    batch = {
        "input_ids": torch.randint(0, 11, (4, 5)),
        "attention_mask": torch.ones(4, 5, dtype=torch.long),
        "labels": torch.randint(0, 11, (4, 5)),
    }
    sb = SelectiveBackprop()  # scale_factor=0.5 by default: token ids cannot be downsampled
    with pytest.raises(ValueError, match="scale_factor"):
        sb.select(batch, TinyLM(), per_sequence_loss, progress=0.0, batch_idx=0)  # long before the window


def test_per_sequence_loss_matches_a_masked_mean() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    labels = torch.randint(0, 7, (3, 5))
    labels[0, 3:] = -100
    labels[2, :] = -100
    got = per_sequence_loss(logits, labels)
    for i in range(3):
        keep = labels[i] != -100
        want = F.cross_entropy(logits[i][keep], labels[i][keep]) if keep.any() else torch.tensor(0.0)
        assert torch.allclose(got[i], want, atol=1e-6)
    shifted = per_sequence_loss(logits, labels, shift=True)
    assert torch.allclose(shifted, per_sequence_loss(logits[:, :-1], labels[:, 1:]))
    assert torch.allclose(per_sequence_loss(logits, labels, reduction="mean"), got.mean())


def test_a_scale_factor_that_leaves_no_pixel_is_refused_before_any_forward() -> None:
    model = CountingModel()  # counts the rows it is run on
    X, y = torch.randn(8, 3, 8, 10), torch.randint(0, 3, (8,))  # the smallest side has 8 pixels
    smallest = r"scale_factor=0.1 would downsample the input of shape \(8, 3, 8, 10\) to 0 pixels.*smallest usable scale_factor for it is 0.125"
    with pytest.raises(ValueError, match=smallest):
        select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.1)
    with pytest.raises(ValueError, match=smallest):
        selection_losses(X, y, model, F.cross_entropy, scale_factor=0.1, chunk_size=3)
    sb = SelectiveBackprop(keep=0.5, scale_factor=0.1, interrupt=0, loss_fn=F.cross_entropy)
    with pytest.raises(ValueError, match=smallest):
        sb.select((X, y), model, progress=0.0, batch_idx=0)  # the first call, long before the window
    with pytest.raises(ValueError, match="smallest usable scale_factor for it is 0.5 "):  # a 1-D signal of 2
        selection_losses(torch.randn(4, 1, 2), y[:4], model, F.cross_entropy, scale_factor=0.4)
    assert model.seen == 0  # refused before any forward
    # the smallest usable value works: one pixel per side
    assert selection_losses(
        X, y, lambda x: x.flatten(1)[:, :3], F.cross_entropy, scale_factor=0.125
    ).shape == (8,)
