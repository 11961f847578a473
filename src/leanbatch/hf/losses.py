"""Token losses as the Trainer's models compute them, weighted per sequence.

Hugging Face causal language models compute their loss as ``ForCausalLMLoss`` does: logits
upcast to float32, labels padded with -100 on the right and shifted left by one, token
cross-entropies summed and divided by ``num_items_in_batch`` (the labelled tokens of the
whole accumulated batch, across processes) or, without it, averaged over the labelled
tokens. :func:`token_losses` computes the same token losses unreduced, so a sequence's
score (its mean token loss) and its weighted share of the loss come from one forward pass,
and with every weight 1 :func:`weighted_loss` is the model's own loss to float precision.
Encoder-decoder, masked-LM and token- or sequence-classification losses use the labels
unshifted (``shift=False``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from leanbatch.losses import sequence_losses, token_losses

__all__ = ["sequence_scores", "token_losses", "weighted_loss"]  # token_losses: from leanbatch.losses


def weighted_loss(tok: Tensor, counted: Tensor, weights: Tensor | None, num_items_in_batch: Any) -> Tensor:
    """``sum(weight_row * token_loss) / num_items_in_batch`` (or the mean over labelled tokens).

    The Trainer's normalisation: over the labelled tokens of the whole accumulated batch when
    it passes ``num_items_in_batch``, else over this batch's labelled tokens; never over
    padding. ``weights`` (one per row, ``None`` = all 1) scale each sequence's token losses.

    Example:
        >>> import torch
        >>> tok = torch.tensor([[1.0, 3.0], [2.0, 0.0]])            # row 1 has one labelled token
        >>> counted = torch.tensor([2, 1])
        >>> float(weighted_loss(tok, counted, None, None)), float(weighted_loss(tok, counted, torch.tensor([2.0, 1.0]), 6))
        (2.0, 1.6666666269302368)
    """
    per_row = tok.sum(dim=1)
    total = per_row.sum() if weights is None else (per_row * weights.to(per_row.dtype)).sum()
    if num_items_in_batch is None:
        return total / counted.sum()
    if isinstance(num_items_in_batch, Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def sequence_scores(tok: Tensor, counted: Tensor) -> Tensor:
    """Each row's score: its per-sequence loss, detached, NaN for a row without a labelled token.

    The score side of :mod:`leanbatch.losses`' convention (a sequence without a labelled token
    is never scored); the adapter itself skips such rows instead of storing NaN.

    Example:
        >>> import torch
        >>> sequence_scores(torch.tensor([[1.0, 3.0], [0.0, 0.0]]), torch.tensor([2, 0])).tolist()
        [2.0, nan]
    """
    return torch.where(counted > 0, sequence_losses(tok.detach(), counted), float("nan"))
