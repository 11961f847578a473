"""Per-example losses for sequence models: token losses -> one loss per sequence.

Selection ranks examples, so a language model's token losses must be reduced to
one number per sequence first. :func:`per_sequence_loss` takes the masked mean
over each sequence's labelled tokens (``labels == ignore_index`` - padding,
prompt tokens - count neither in the sum nor in the length) and follows
Composer's loss convention, so it can be passed wherever a ``loss_fun`` is.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["per_sequence_loss"]


def per_sequence_loss(
    logits: Tensor,
    labels: Tensor,
    ignore_index: int = -100,
    *,
    reduction: str = "none",
    shift: bool = False,
) -> Tensor:
    """Cross-entropy per sequence: the mean over tokens whose label is not ``ignore_index``.

    Args:
        logits: ``(batch, seq_len, vocab)`` (Hugging Face layout).
        labels: ``(batch, seq_len)`` integer token ids; ``ignore_index`` marks
            tokens that do not count. A sequence with no labelled token gets loss 0.
        ignore_index: the label value to ignore (-100, as in PyTorch and HF).
        reduction: ``"none"`` (shape ``(batch,)``, float32), ``"mean"`` or ``"sum"``
            over sequences.
        shift: predict token ``t + 1`` from position ``t`` (causal LM labels that
            are a copy of the inputs, as HF models shift them internally).

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 3, 5)  # uniform predictions: every token costs log(5)
        >>> labels = torch.tensor([[1, 2, -100], [-100, -100, -100]])
        >>> [round(x, 4) for x in per_sequence_loss(logits, labels).tolist()]
        [1.6094, 0.0]
    """
    if not isinstance(logits, Tensor) or not isinstance(labels, Tensor):
        raise TypeError("logits and labels must be tensors")
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape (batch, seq_len, vocab), got {tuple(logits.shape)}")
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"labels must have shape (batch, seq_len) = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}"
        )
    if labels.is_floating_point():
        raise TypeError(f"labels must be integer token ids, got {labels.dtype}")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    b, t, v = logits.shape
    tokens = F.cross_entropy(
        logits.reshape(b * t, v), labels.reshape(b * t), ignore_index=ignore_index, reduction="none"
    ).view(b, t)
    counted = (labels != ignore_index).sum(dim=1).clamp_min(1)
    per_seq = tokens.float().sum(dim=1) / counted
    if reduction == "mean":
        return per_seq.mean()
    if reduction == "sum":
        return per_seq.sum()
    return per_seq
