"""Misuses of the selection API fail at the first call with one error naming the argument and the fix
(issue 25: a model that cannot take the downsampled input, model and loss swapped, a progress
outside [0, 1], RHO-LOSS irreducible losses as a list or shorter than the dataset)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from leanbatch import SelectiveBackprop, select_using_loss, selection_losses
from leanbatch.selection import RhoLoss


def image_mlp() -> nn.Module:
    """An MLP on 8x8 images: its first Linear needs the 64 full-size pixels."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def images(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 1, 8, 8), torch.randint(0, 10, (n,))


def test_a_model_that_needs_the_full_size_input_names_scale_factor_and_the_shapes() -> None:
    X, y = images()
    shapes = r"scale_factor=0\.5 from \(N, 1, 8, 8\) to \(N, 1, 4, 4\).*needs scale_factor=1"
    with pytest.raises(ValueError, match=shapes) as info:  # SelectiveBackprop's default scale_factor
        SelectiveBackprop().select((X, y), image_mlp(), F.cross_entropy, progress=0.6, batch_idx=0)
    assert isinstance(info.value.__cause__, RuntimeError)  # chained: the model's own error is kept
    with pytest.raises(ValueError, match=shapes):
        select_using_loss(X, y, image_mlp(), F.cross_entropy, keep=0.5, scale_factor=0.5)
    with pytest.raises(ValueError, match=shapes):
        selection_losses(X, y, image_mlp(), F.cross_entropy, scale_factor=0.5, chunk_size=5)
    # the full-size forward is not wrapped: the model's error is its own
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        select_using_loss(torch.randn(4, 1, 4, 4), y[:4], image_mlp(), F.cross_entropy, scale_factor=1)


def test_flat_features_with_scale_factor_below_one_are_refused_naming_it() -> None:
    X, y, mlp = torch.randn(32, 10), torch.randint(0, 10, (32,)), nn.Linear(10, 10)
    with pytest.raises(ValueError, match=r"scale_factor=0\.5 < 1 .* got \[\(32, 10\)\]\. Use scale_factor=1"):
        SelectiveBackprop().select(
            (X, y), mlp, F.cross_entropy, progress=0.1, batch_idx=0
        )  # before the window
    with pytest.raises(ValueError, match="Use scale_factor=1"):
        select_using_loss(X, y, mlp, F.cross_entropy, keep=0.5, scale_factor=0.5)


def test_model_and_loss_swapped_name_both() -> None:
    X, y, mlp = torch.randn(8, 10), torch.randint(0, 10, (8,)), nn.Linear(10, 10)
    with pytest.raises(TypeError, match="model and loss_fun look swapped"):
        select_using_loss(X, y, F.cross_entropy, mlp, keep=0.5)
    with pytest.raises(TypeError, match="model and loss_fun look swapped"):
        select_using_loss(X, y, F.cross_entropy, mlp, keep=1.0)  # nothing to select: still refused
    sb = SelectiveBackprop(scale_factor=1.0)
    with pytest.raises(TypeError, match="model and loss_fn look swapped.*CrossEntropyLoss"):
        sb.select((X, y), nn.CrossEntropyLoss(), mlp, progress=0.1, batch_idx=0)  # whatever the progress
    with pytest.raises(TypeError, match="model is cross_entropy, a loss function.*as model"):
        SelectiveBackprop(scale_factor=1.0, loss_fn=F.cross_entropy).select(
            (X, y), F.cross_entropy, progress=0.6, batch_idx=0
        )
    with pytest.raises(TypeError, match="loss_fn is the network Linear"):
        SelectiveBackprop(scale_factor=1.0).select((X, y), mlp, nn.Linear(10, 1), progress=0.6, batch_idx=0)


def test_legitimate_models_and_losses_are_still_accepted() -> None:
    X, y, mlp = torch.randn(8, 10), torch.randint(0, 10, (8,)), nn.Linear(10, 10)

    class TemperedLoss(nn.Module):  # a loss module with a parameter, not an nn loss class
        def __init__(self) -> None:
            super().__init__()
            self.t = nn.Parameter(torch.ones(()))

        def forward(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
            return F.cross_entropy(out / self.t, y, reduction=reduction)

    assert select_using_loss(X, y, lambda x: mlp(x), TemperedLoss(), keep=0.5)[1].shape == (4,)
    assert select_using_loss(X, y, mlp, nn.CrossEntropyLoss(), keep=0.5)[1].shape == (4,)
    sb = SelectiveBackprop(scale_factor=1.0, interrupt=0, forward_fn=lambda _, x: mlp(x))
    assert sb.select((X, y), None, F.cross_entropy, progress=0.6, batch_idx=0).batch[1].shape == (4,)


@pytest.mark.parametrize("progress", [float("nan"), float("inf"), -0.1, 1.5])
def test_progress_outside_zero_one_is_refused_naming_it(progress: float) -> None:
    sb = SelectiveBackprop(scale_factor=1.0, loss_fn=F.cross_entropy)
    batch = (torch.randn(8, 10), torch.randint(0, 10, (8,)))
    with pytest.raises(ValueError, match=r"progress must be a finite number in \[0, 1\].*training_progress"):
        sb.select(batch, nn.Linear(10, 10), progress=progress, batch_idx=0)


def test_irreducible_as_a_list_or_numpy_array_is_accepted() -> None:
    X, y, idx = torch.randn(8, 10), torch.randint(0, 10, (8,)), torch.arange(8)
    chosen = []
    for irreducible in ([0.5] * 8, np.full(8, 0.5), torch.full((8,), 0.5, dtype=torch.float64)):
        rho = RhoLoss(irreducible, keep=0.5, loss_fn=F.cross_entropy)
        assert rho.source.irreducible.dtype == torch.float32
        chosen.append(rho.select((X, y), nn.Linear(10, 10), progress=0.5, batch_idx=0, indices=idx))
    assert all(sel.positions.shape == (4,) for sel in chosen)
    with pytest.raises(TypeError, match=r"irreducible must be a float tensor of shape \(N,\)"):
        RhoLoss(["a", "b"])
    with pytest.raises(ValueError, match="irreducible must hold finite losses"):
        RhoLoss([0.0, float("nan")])


def test_irreducible_shorter_than_the_dataset_names_its_length_and_the_index() -> None:
    rho = RhoLoss(torch.zeros(16), keep=0.5, loss_fn=F.cross_entropy)
    X, y = torch.randn(8, 10), torch.randint(0, 10, (8,))
    model = nn.Linear(10, 10)
    short = (
        r"irreducible holds 16 losses but the largest index of the batch is 23: indices must be in \[0, 16\)"
    )
    with pytest.raises(IndexError, match=short + ".*whole training set"):
        rho.select((X, y), model, progress=0.5, batch_idx=0, indices=torch.arange(16, 24))
    with pytest.raises(IndexError, match="irreducible holds 16 losses but the batch has index -1"):
        rho.select((X, y), model, progress=0.5, batch_idx=0, indices=torch.arange(-1, 7))
