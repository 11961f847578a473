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
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sequence_scores", "token_losses", "weighted_loss"]


def token_losses(
    logits: Tensor, labels: Tensor, shift: bool, ignore_index: int = -100
) -> tuple[Tensor, Tensor]:
    """Per-token cross-entropy ``(n, tokens)`` (float32, 0 where ignored) and labelled tokens per row ``(n,)``.

    Args:
        logits: ``(n, ..., vocab)``; a sequence classifier's ``(n, classes)`` works too.
        labels: ``(n, ...)`` integer targets matching ``logits`` without its last dimension;
            ``ignore_index`` marks prompt and padding tokens.
        shift: causal LM: position ``t`` predicts label ``t + 1`` (the Trainer's rule).

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 3, 5)                          # uniform: every token costs log(5)
        >>> labels = torch.tensor([[-100, 2, 4], [-100, 1, -100]])  # prompt token, then the response
        >>> tok, counted = token_losses(logits, labels, shift=True)
        >>> [[round(x, 4) for x in row] for row in tok.tolist()], counted.tolist()
        ([[1.6094, 1.6094, 0.0], [1.6094, 0.0, 0.0]], [2, 1])
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError("the model output must hold floating-point logits (outputs.logits)")
    if not isinstance(labels, Tensor) or labels.is_floating_point():
        raise TypeError(
            "leanbatch.hf trains cross-entropy losses: labels must be integer class or token ids "
            f"(-100 = ignored), got {getattr(labels, 'dtype', type(labels).__name__)}; regression and "
            "multi-label losses are not supported"
        )
    if shift:
        labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    if tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}: expected logits of "
            "shape labels.shape + (vocab,), one prediction per label"
        )
    n = labels.shape[0]
    tok = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1).to(logits.device),
        ignore_index=ignore_index,
        reduction="none",
    ).view(n, -1)
    counted = (labels != ignore_index).reshape(n, -1).sum(dim=1).to(logits.device)
    return tok, counted


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
    """Mean token loss per row over its labelled tokens, detached, float32 (NaN for a row without one).

    Example:
        >>> import torch
        >>> sequence_scores(torch.tensor([[1.0, 3.0], [0.0, 0.0]]), torch.tensor([2, 0])).tolist()
        [2.0, nan]
    """
    return (tok.detach().sum(dim=1) / counted).to(torch.float32)
