"""Batch structures (leanbatch.selection.batches, layout): rows stay aligned, any structure round-trips."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from selection_helpers import (
    cnn,
)

from leanbatch import SelectiveBackprop
from leanbatch.selection.batches import BatchAccumulator, concat_batches, index_batch, slice_batch


def test_tuple_batch_carries_indices_and_weights_along() -> None:
    torch.manual_seed(0)
    n = 20
    X, y = torch.randn(n, 1, 8, 8), torch.randint(0, 10, (n,))
    idx = torch.arange(100, 100 + n)
    w = torch.linspace(1, 2, n)  # e.g. InfoBatch loss weights
    sb = SelectiveBackprop(interrupt=0, keep=0.25)
    (Xs, ys, idxs, ws), pos, losses = sb.select((X, y, idx, w), cnn(), F.cross_entropy, 0.6, 0)
    assert pos is not None and losses is not None
    assert torch.equal(idxs, idx[pos]) and torch.equal(ws, w[pos]) and torch.equal(Xs, X[pos])


def test_bare_tensor_batch_is_input_and_target() -> None:
    def recon(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return F.mse_loss(out, target, reduction="none").flatten(1).mean(1)

    X = torch.randn(10, 1, 4, 4)
    X[7] *= 10  # by far the worst reconstruction of a model that outputs zeros
    zeros = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.Unflatten(1, (1, 4, 4)))
    nn.init.zeros_(zeros[1].weight)
    nn.init.zeros_(zeros[1].bias)
    sb = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0)
    out = sb.select(X, zeros, recon, progress=0.5, batch_idx=0)
    assert out.losses is not None and out.positions is not None
    # the batch was the target too: each loss is the row's mean square, i.e. |X - 0|^2
    assert torch.allclose(out.losses, X.pow(2).flatten(1).mean(1))
    assert isinstance(out.batch, torch.Tensor) and torch.equal(out.batch, X[out.positions])
    assert out.positions.shape == (5,)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_slicing_and_concatenating_batches_round_trips(sizes: list[int]) -> None:
    total = sum(sizes)
    batch = {"x": torch.arange(total * 2).view(total, 2), "y": (torch.arange(total), "meta")}
    parts, start = [], 0
    for s in sizes:
        parts.append(slice_batch(batch, start, start + s, total))
        start += s
    whole = concat_batches(parts, sizes)
    assert torch.equal(whole["x"], batch["x"]) and torch.equal(whole["y"][0], batch["y"][0])
    assert whole["y"][1] == "meta"
    acc = BatchAccumulator(4)
    for p, s in zip(parts, sizes, strict=True):
        acc.add(p, s)
    out = []
    while (b := acc.pop()) is not None:
        out.append(b["y"][0])
    rest = acc.flush()
    if rest is not None:
        out.append(rest["y"][0])
    assert torch.equal(torch.cat(out), torch.arange(total)) and all(len(o) == 4 for o in out[:-1])


def test_index_batch_keeps_namedtuples_and_other_lengths() -> None:
    from collections import namedtuple

    B = namedtuple("B", "x y classes")
    b = B(torch.arange(6), torch.arange(6) * 2, torch.arange(10))
    out = index_batch(b, torch.tensor([0, 5]), 6)
    assert isinstance(out, B) and out.y.tolist() == [0, 10] and out.classes.shape == (10,)
