"""Packed and padding-free batches in the Hugging Face adapter: every token's sample.

A packing collator (``DataCollatorWithFlattening``; TRL's ``padding_free=True`` and its BFD
``packing=True``) joins the samples the sampler served into one row (or a few), told apart by
``position_ids`` that restart at each sequence or by ``cu_seq_lens_q``; it returns them *instead
of* an ``attention_mask``, which is how a batch is recognised as packed (:func:`is_packed`).
Pruning happens before packing: the sampler serves the plan, the collator packs what was served.

Each served sample contributes its packed sequences in the order it was served
(:func:`sequences_per_item`): one, none for an empty ``input_ids`` (which
``DataCollatorWithFlattening`` drops and TRL's collator packs into nothing), or, for TRL's BFD
rows (``seq_lengths``), the sequences TRL packed into that dataset row, which is then the sample
InfoBatch scores and prunes. So each token's sample is a gather of each token's packed sequence
(:func:`packed_losses`), and each sample's score is the mean token loss over its own labelled
tokens, the number it gives unpacked.

Example:
    >>> import torch
    >>> labels = torch.tensor([[-100, 5, -100, -100, 7, 8]])
    >>> batch = {"labels": labels, "position_ids": torch.tensor([[0, 1, 0, 0, 1, 2]])}
    >>> items = [{"input_ids": [1, 2]}, {"input_ids": []}, {"input_ids": [3]}, {"input_ids": [4, 5, 6]}]
    >>> packing = packing_of(batch, sequences_per_item(items))    # no attention_mask: packed
    >>> packed_losses(torch.ones(1, 6), labels, packing, True)[0].tolist()   # sample 1 is empty: no token
    [[0, 0, 2, 3, 3, 3]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from leanbatch.losses import segment_losses
from leanbatch.packing import check_packed_labels, packed_sequence_ids, require_values

__all__ = [
    "Packing",
    "is_packed",
    "packed_losses",
    "packing_of",
    "sequences_per_item",
    "token_weights",
]


class Packing(NamedTuple):
    """How a packed batch's samples lie in it: what tells its sequences apart, and each sample's count.

    ``sequences``: int64 CPU ``(n,)``, the packed sequences each served sample contributes.
    """

    position_ids: Tensor | None
    cu_seq_lens: Tensor | None
    sequences: Tensor


def is_packed(batch: Mapping[str, Any]) -> bool:
    """Whether a collated batch packs several sequences per row (Hugging Face's convention).

    The packing collators return ``position_ids`` in place of an ``attention_mask``, or the
    flash-attention boundaries ``cu_seq_lens_q``; a padded batch has an attention mask.
    """
    return "cu_seq_lens_q" in batch or ("position_ids" in batch and "attention_mask" not in batch)


def sequences_per_item(items: Sequence[Any]) -> Tensor:
    """The packed sequences each item makes: 0 for empty ``input_ids``, ``len(seq_lengths)`` for a
    TRL BFD row, else 1 (int64, CPU).
    """
    counts = []
    for item in items:
        count = 1
        if isinstance(item, Mapping):
            ids, lengths = item.get("input_ids"), item.get("seq_lengths")
            if ids is not None and len(ids) == 0:
                count = 0
            elif lengths is not None:
                count = len(lengths)
        counts.append(count)
    return torch.tensor(counts, dtype=torch.int64)


def packing_of(batch: Mapping[str, Any], sequences: Tensor) -> Packing | None:
    """The :class:`Packing` of a packed batch, ``None`` for a padded one (one sample per row).

    A batch with fewer or more rows than samples and nothing that tells its sequences apart
    (no ``position_ids``, no ``cu_seq_lens_q``) is refused, naming the fix.
    """
    if is_packed(batch):
        return Packing(batch.get("position_ids"), batch.get("cu_seq_lens_q"), sequences)
    labels = batch.get("labels")
    if not isinstance(labels, Tensor) or labels.dim() == 0 or labels.shape[0] == len(sequences):
        return None
    raise ValueError(
        f"the collator packed {len(sequences)} samples into {labels.shape[0]} row(s) without position_ids or "
        "cu_seq_lens_q: nothing tells its sequences apart, so neither the model's attention nor the "
        "per-sample losses can; have the collator return position_ids that restart at each sequence "
        "(DataCollatorWithFlattening(return_position_ids=True), TRL's padding_free=True), or pad the batch"
    )


def packed_losses(
    tok: Tensor, labels: Tensor, packing: Packing, shift: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """(each token's sample, each sample's mean token loss, each sample's labelled tokens).

    ``tok`` are the token losses of :func:`~leanbatch.losses.token_losses` (0 where ignored).
    With ``shift`` (causal LMs), every packed sequence must start with an ignored label, as the
    packing collators make it (:func:`~leanbatch.packing.check_packed_labels`).
    """
    labels = labels.to(tok.device)
    n, total = len(packing.sequences), int(packing.sequences.sum())
    if total == 0:
        raise ValueError("every sample of this packed batch is empty (input_ids of length 0)")
    seq = packed_sequence_ids(labels, position_ids=packing.position_ids, cu_seq_lens=packing.cu_seq_lens)
    require_values(
        seq[-1, -1] + 1 >= total,
        f"position_ids: the batch packs {total} sequence(s) from its {n} samples, but "
        "its position ids (or cu_seq_lens_q) restart fewer times: they must restart where each sample "
        "begins; pass the packing collator's position_ids (DataCollatorWithFlattening, TRL's padding-free "
        "collator) unchanged",
    )
    seq = seq.to(labels.device)
    # each packed sequence's sample, gathered per token; tokens past the last sequence get n
    owner = torch.cat([torch.repeat_interleave(torch.arange(n), packing.sequences), torch.tensor([n])])
    ids = owner.to(seq.device, non_blocking=True)[seq.clamp(max=total)]
    if shift:
        check_packed_labels(labels, seq)
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    labelled = labels != -100
    require_values(
        ~labelled.masked_select(ids == n).any(),
        f"position_ids: labelled tokens lie past the {n} samples' packed sequences (the position ids restart "
        "more often than the samples imply): pass the packing collator's position_ids unchanged",
    )
    losses, counted = segment_losses(tok, labelled, ids, n)
    return ids, losses, counted


def token_weights(weights: Tensor, ids: Tensor) -> Tensor:
    """Each token's weight: its sample's (``weights``, ``(n,)``), 0 for padding (id ``n``)."""
    return torch.cat([weights, weights.new_zeros(1)])[ids]
