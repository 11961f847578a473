"""Per-sequence losses for token models: one convention for every part of leanbatch.

A language model's token losses are reduced to one number per sequence (selection ranks
sequences; InfoBatch scores and weights them) as the masked mean over the sequence's labelled
tokens: tokens whose label is ``ignore_index`` (padding, prompt tokens) count neither in the sum
nor in the length. The token losses are computed as Hugging Face's ``ForCausalLMLoss`` computes
them (logits upcast to float32; with ``shift``, position ``t`` predicts label ``t + 1``).

**A sequence with no labelled token** has per-sequence loss **0**: it adds nothing to a
gradient and ranks as the easiest. It is **never scored**: the code that stores scores (the
Hugging Face adapter) skips it, so it keeps the score it had, or none.

**Packed rows** (several sequences in one row, told apart by ``position_ids`` or ``cu_seq_lens``:
see :mod:`leanbatch.packing`) give one loss per packed *sequence*, the mean over its own labelled
tokens, equal to what the same sequences give unpacked (:func:`per_sequence_loss`).

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
from leanbatch.packing import check_packed_labels, packed_sequence_ids, require_values

__all__ = ["per_sequence_loss", "segment_losses", "sequence_losses", "token_losses"]


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


def segment_losses(tok: Tensor, labelled: Tensor, ids: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """The mean token loss of each of ``count`` packed sequences (float32; 0 without a labelled
    token) and each one's labelled tokens (int64).

    ``ids`` (from :func:`~leanbatch.packing.packed_sequence_ids`) number the tokens row-major,
    never decreasing, so each sequence is one run of the flattened batch and its sum is a
    difference of a float64 running sum: deterministic on every device (no atomic adds), and
    vectorised. Tokens numbered ``count`` or more (padding) belong to none.

    Example:
        >>> import torch
        >>> tok = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
        >>> labelled = torch.tensor([[True, True, True, False]])
        >>> loss, n = segment_losses(tok, labelled, torch.tensor([[0, 0, 1, 2]]), 2)
        >>> loss.tolist(), n.tolist()
        ([2.0, 2.0], [2, 1])
    """
    flat = ids.reshape(-1)
    bounds = torch.searchsorted(flat, torch.arange(count + 1, device=flat.device))
    sums = F.pad(tok.reshape(-1).double().cumsum(0), (1, 0))
    seen = F.pad(labelled.reshape(-1).to(flat.device, torch.int64).cumsum(0), (1, 0))
    counted = seen[bounds[1:]] - seen[bounds[:-1]]
    mean = (sums[bounds[1:]] - sums[bounds[:-1]]) / counted.clamp(min=1)
    return mean.to(torch.float32), counted


def per_sequence_loss(
    logits: Tensor,
    labels: Tensor,
    ignore_index: int = -100,
    *,
    reduction: str = "none",
    shift: bool = False,
    position_ids: Tensor | None = None,
    cu_seq_lens: Tensor | None = None,
    num_sequences: int | None = None,
) -> Tensor:
    """Cross-entropy per sequence: the mean over tokens whose label is not ``ignore_index``.

    Follows Composer's loss convention, so it can be passed wherever a ``loss_fun`` is.

    Args:
        logits: ``(batch, seq_len, vocab)`` (Hugging Face layout).
        labels: ``(batch, seq_len)`` integer token ids; ``ignore_index`` marks tokens that do
            not count. A sequence with no labelled token gets loss 0 (see the module docstring).
        ignore_index: the label value to ignore (-100, as in PyTorch and HF).
        reduction: ``"none"`` (one loss per sequence, float32), ``"mean"`` or ``"sum"`` over sequences.
        shift: predict token ``t + 1`` from position ``t`` (causal LM labels that are a copy of
            the inputs, as HF models shift them internally). Labels a collator already shifted
            (``shift_labels``) go in as ``labels`` with ``shift=False``.
        position_ids, cu_seq_lens: a packed batch's sequences (:mod:`leanbatch.packing`): one
            loss per packed sequence, in packing order, equal to the same sequences unpacked.
            With ``shift`` every packed sequence must start with an ignored label (the packing
            collators' separator), else the shifted loss crosses sequences: refused.
        num_sequences: how many sequences the batch packs (e.g. its dataset indices); the losses
            then have this length, tokens after them are padding (refused if labelled), and no
            host sync is needed to count the sequences (without it, ``position_ids`` cost one:
            the count sizes the result). Without packing, it must equal the number of rows.

    Example:
        >>> import torch
        >>> per_sequence_loss(torch.zeros(2, 3, 5), torch.tensor([[1, 2, 3], [4, 0, -100]]), reduction="mean") > 0
        tensor(True)
        >>> labels = torch.tensor([[-100, 1, 2, -100, 3]])   # two sequences packed in one row
        >>> pos = torch.tensor([[0, 1, 2, 0, 1]])
        >>> per_sequence_loss(torch.zeros(1, 5, 5), labels, shift=True, position_ids=pos).shape
        torch.Size([2])
    """
    if isinstance(logits, Tensor) and logits.dim() != 3:  # token_losses checks the rest
        raise ValueError(f"logits must have shape (batch, seq_len, vocab), got {tuple(logits.shape)}")
    check_choice(reduction, "reduction", ("none", "mean", "sum"))
    if position_ids is None and cu_seq_lens is None and num_sequences is None:
        per_seq = sequence_losses(*token_losses(logits, labels, shift, ignore_index))
    else:
        per_seq = _packed(logits, labels, ignore_index, shift, position_ids, cu_seq_lens, num_sequences)
    return per_seq if reduction == "none" else getattr(per_seq, reduction)()


def _packed(
    logits: Tensor,
    labels: Tensor,
    ignore_index: int,
    shift: bool,
    position_ids: Tensor | None,
    cu_seq_lens: Tensor | None,
    num_sequences: int | None,
) -> Tensor:
    """:func:`per_sequence_loss` of a packed batch: one loss per packed sequence."""
    tok, _ = token_losses(logits, labels, shift, ignore_index)
    ids = packed_sequence_ids(
        labels, position_ids=position_ids, cu_seq_lens=cu_seq_lens, num_sequences=num_sequences
    ).to(logits.device)
    if shift:
        check_packed_labels(labels, ids, ignore_index)
    targets = F.pad(labels, (0, 1), value=ignore_index)[..., 1:] if shift else labels
    labelled = targets.to(logits.device) != ignore_index
    if num_sequences is not None:
        count = num_sequences
    elif cu_seq_lens is not None:
        count = cu_seq_lens.numel() - 1
    else:
        count = int(ids[-1, -1]) + 1  # the one host sync: the number of sequences sizes the result
    loss, _ = segment_losses(tok, labelled, ids, count)
    if num_sequences is not None:  # the tokens past the last sequence are padding: no label
        require_values(
            ~labelled.masked_select(ids == count).any(),
            f"num_sequences={count} but the batch has labelled tokens after its {count}-th packed "
            "sequence: pass the number of sequences the batch packs (padding only at the end)",
        )
    return loss
