"""Per-sequence losses for token models: one convention for every part of leanbatch.

A language model's token losses are reduced to one number per sequence (selection ranks
sequences; InfoBatch scores and weights them) as the masked mean over the sequence's labelled
tokens: tokens whose label is ``ignore_index`` (padding, prompt tokens) count neither in the sum
nor in the length. The token losses are computed as Hugging Face's ``ForCausalLMLoss`` computes
them (logits upcast to float32; with ``shift``, position ``t`` predicts label ``t + 1``).

**A sequence with no labelled token** has per-sequence loss **0**: it adds nothing to a
gradient and ranks as the easiest. It is **never scored**: the code that stores scores (the
Hugging Face adapter) skips it, so it keeps the score it had, or none.

Example:
    >>> import torch
    >>> logits = torch.zeros(2, 3, 5)  # uniform predictions: every token costs log(5)
    >>> labels = torch.tensor([[1, 2, -100], [-100, -100, -100]])
    >>> [round(x, 4) for x in per_sequence_loss(logits, labels).tolist()]
    [1.6094, 0.0]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from leanbatch.checks import check_choice

__all__ = ["per_sequence_loss", "sequence_losses", "token_losses"]


def token_losses(
    logits: Tensor, labels: Tensor, shift: bool = False, ignore_index: int = -100
) -> tuple[Tensor, Tensor]:
    """Per-token cross-entropy ``(n, tokens)`` (float32, 0 where ignored) and labelled tokens per row ``(n,)``.

    Args:
        logits: ``(n, ..., vocab)``; a sequence classifier's ``(n, classes)`` works too.
        labels: ``(n, ...)`` integer targets matching ``logits`` without its last dimension;
            ``ignore_index`` marks prompt and padding tokens.
        shift: causal LM: position ``t`` predicts label ``t + 1`` (the Trainer's rule).

    Example:
        >>> import torch
        >>> logits = torch.zeros(2, 3, 5)
        >>> labels = torch.tensor([[-100, 2, 4], [-100, 1, -100]])  # prompt token, then the response
        >>> tok, counted = token_losses(logits, labels, shift=True)
        >>> [[round(x, 4) for x in row] for row in tok.tolist()], counted.tolist()
        ([[1.6094, 1.6094, 0.0], [1.6094, 0.0, 0.0]], [2, 1])
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError("the model output must hold floating-point logits (outputs.logits)")
    if not isinstance(labels, Tensor) or labels.is_floating_point():
        raise TypeError(
            "leanbatch trains cross-entropy losses per sequence: labels must be integer class or token ids "
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


def sequence_losses(tok: Tensor, counted: Tensor) -> Tensor:
    """The mean token loss of each row over its labelled tokens, float32; 0 for a row without one.

    Example:
        >>> import torch
        >>> sequence_losses(torch.tensor([[1.0, 3.0], [0.0, 0.0]]), torch.tensor([2, 0])).tolist()
        [2.0, 0.0]
    """
    return (tok.sum(dim=1) / counted.clamp(min=1)).to(torch.float32)


def per_sequence_loss(
    logits: Tensor,
    labels: Tensor,
    ignore_index: int = -100,
    *,
    reduction: str = "none",
    shift: bool = False,
) -> Tensor:
    """Cross-entropy per sequence: the mean over tokens whose label is not ``ignore_index``.

    Follows Composer's loss convention, so it can be passed wherever a ``loss_fun`` is.

    Args:
        logits: ``(batch, seq_len, vocab)`` (Hugging Face layout).
        labels: ``(batch, seq_len)`` integer token ids; ``ignore_index`` marks tokens that do
            not count. A sequence with no labelled token gets loss 0 (see the module docstring).
        ignore_index: the label value to ignore (-100, as in PyTorch and HF).
        reduction: ``"none"`` (shape ``(batch,)``, float32), ``"mean"`` or ``"sum"`` over sequences.
        shift: predict token ``t + 1`` from position ``t`` (causal LM labels that are a copy of
            the inputs, as HF models shift them internally).

    Example:
        >>> import torch
        >>> per_sequence_loss(torch.zeros(2, 3, 5), torch.tensor([[1, 2, 3], [4, 0, -100]]), reduction="mean") > 0
        tensor(True)
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
    check_choice(reduction, "reduction", ("none", "mean", "sum"))
    per_seq = sequence_losses(*token_losses(logits, labels, shift, ignore_index))
    if reduction == "mean":
        return per_seq.mean()
    if reduction == "sum":
        return per_seq.sum()
    return per_seq
