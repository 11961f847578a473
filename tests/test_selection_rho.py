"""RHO-LOSS: rows are kept by training loss minus irreducible loss, with the right errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from leanbatch.selection import RhoLoss


class LossIsTarget(torch.nn.Module):
    """A 'model' whose cross-entropy loss on row i is known: logits favouring class 0 by x[:, 0]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:, 0], torch.zeros_like(x[:, 0])], 1)


def test_the_kept_rows_have_the_largest_reducible_loss_not_the_largest_loss():
    # rows 0..3 with training losses rising with x (target class 1), irreducible losses that make
    # the hardest rows 2 and 3 mostly irreducible
    x = torch.tensor([[0.0], [1.0], [4.0], [6.0]])
    y = torch.ones(4, dtype=torch.long)
    idx = torch.tensor([10, 11, 12, 13])
    model = LossIsTarget()
    train_loss = F.cross_entropy(model(x), y, reduction="none")
    irreducible = torch.zeros(20)
    irreducible[12], irreducible[13] = train_loss[2] - 0.01, train_loss[3] - 0.02
    rho = RhoLoss(irreducible, keep=0.5, loss_fn=F.cross_entropy)
    sel = rho.select((x, y), model, progress=0.5, batch_idx=0, indices=idx)
    assert sel.positions.tolist() == [0, 1]  # by raw loss it would be [2, 3]
    torch.testing.assert_close(sel.losses, train_loss - irreducible[idx])
    assert rho.stats.forwarded == 4 and rho.stats.backpropagated == 2


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="irreducible"):
        RhoLoss(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="irreducible"):
        RhoLoss(torch.zeros(2, 2))
    rho = RhoLoss(torch.zeros(8), keep=0.5, loss_fn=F.cross_entropy)
    with pytest.raises(ValueError, match="dataset indices"):
        rho.select(
            (torch.zeros(4, 1), torch.ones(4, dtype=torch.long)), LossIsTarget(), progress=0.5, batch_idx=0
        )
