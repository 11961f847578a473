"""Packed and padding-free batches: which packed sequence each token belongs to.

A packed (or padding-free) batch holds several training sequences in one row. Hugging Face tells
them apart in two ways, and this module follows both exactly:

- ``position_ids`` (``DataCollatorWithFlattening``, TRL's ``padding_free=True`` and its BFD
  ``packing=True``): a sequence starts at a row's first token and wherever the position id does
  not continue the previous token's (``diff != 1``): the rule of
  ``transformers.masking_utils.find_packed_sequence_indices``, by which the sdpa and eager
  attention masks keep the sequences apart. Every sequence must start at the same position (the
  batch's first, 0 unless the collator's ``position_ids_start`` says otherwise), so left-padded
  position ids (``[1, 1, 0, 1, 2]``) are refused rather than read as sequences.
- ``cu_seq_lens`` (``cu_seq_lens_q`` of ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``
  and of TRL's padding-free collator; flash-attention's varlen boundaries): ``[0, l0, l0 + l1, ...,
  total]`` over the batch flattened row by row; a sequence never spans two rows.

Sequences are numbered in row-major order, the order the collator packed them. TRL pads a
padding-free row on the right (``pad_to_multiple_of``) with position id 0, so to the model every
padding token is a sequence of its own; a caller that knows how many sequences it packed passes
``num_sequences=n``, and every token after the ``n``-th sequence then gets id ``n`` (padding; it
must carry no label, :func:`~leanbatch.losses.per_sequence_loss` checks).

Validation reads tensor values: on the CPU it raises at once; on a device it is a device-side
assert (``torch._assert_async``), so nothing here waits for the device.

Example:
    >>> import torch
    >>> labels = torch.tensor([[-100, 5, 6, -100, 7]])          # two sequences, 3 and 2 tokens
    >>> packed_sequence_ids(labels, position_ids=torch.tensor([[0, 1, 2, 0, 1]])).tolist()
    [[0, 0, 0, 1, 1]]
    >>> packed_sequence_ids(labels, cu_seq_lens=torch.tensor([0, 3, 5], dtype=torch.int32)).tolist()
    [[0, 0, 0, 1, 1]]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import INTEGER_DTYPES, check_int

__all__ = ["check_packed_labels", "packed_sequence_ids", "require_values"]


def require_values(ok: Tensor, message: str) -> None:
    """Raise ``ValueError(message)`` unless the 0-d bool ``ok`` holds; on a device, a device-side assert."""
    if ok.device.type == "cpu":
        if not bool(ok):
            raise ValueError(message)
    else:  # no host sync: the device raises if it does not hold
        torch._assert_async(ok, message)


def packed_sequence_ids(
    labels: Tensor,
    *,
    position_ids: Tensor | None = None,
    cu_seq_lens: Tensor | None = None,
    num_sequences: int | None = None,
) -> Tensor:
    """The packed sequence of every token: an int64 tensor shaped like ``labels``, numbered row-major.

    Per-token weights from per-sequence ones are then one gather, ``weights[ids]`` (with
    ``num_sequences=n``: ``torch.cat([weights, weights.new_zeros(1)])[ids]``, the padding weighing 0).
    Vectorised; no host sync (see the module docstring for what is checked, and where).

    Args:
        labels: ``(rows, tokens)``, the batch's labels (or input ids): their shape and device.
        position_ids: ``(rows, tokens)`` or ``(1, tokens)``: sequences start where they do not
            continue by 1 (Hugging Face's rule).
        cu_seq_lens: 1-D ``[0, ..., rows * tokens]``, strictly increasing. With ``position_ids``
            too (TRL gives both), the two must agree.
        num_sequences: how many sequences the batch packs (the collator knows: one per sample);
            tokens after them get id ``num_sequences`` (padding). Without ``position_ids`` and
            ``cu_seq_lens`` every row is one sequence, so it must equal the number of rows: a
            packed batch without them is refused here.

    Example:
        >>> import torch
        >>> labels = torch.tensor([[-100, 4, -100, 6, -100, -100]])   # 2 sequences, then TRL's padding
        >>> pos = torch.tensor([[0, 1, 0, 1, 0, 0]])
        >>> packed_sequence_ids(labels, position_ids=pos, num_sequences=2).tolist()
        [[0, 0, 1, 1, 2, 2]]
    """
    if not isinstance(labels, Tensor) or labels.dim() != 2:
        got = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be a (rows, tokens) tensor, got {got}")
    rows, tokens = labels.shape
    n = None if num_sequences is None else check_int(num_sequences, "num_sequences", 1)
    if position_ids is None and cu_seq_lens is None:
        if n is not None and n != rows:
            raise ValueError(
                f"num_sequences={n} but the batch has {rows} row(s) and neither position_ids nor "
                "cu_seq_lens: a packed batch (several sequences in one row) needs them to tell its "
                "sequences apart; pass the collator's position_ids (or cu_seq_lens_q)"
            )
        return torch.arange(rows, device=labels.device).unsqueeze(1).expand(rows, tokens)
    pos = None if position_ids is None else _check_positions(position_ids, rows, tokens)
    if cu_seq_lens is not None:
        ids, count = _ids_from_cu(cu_seq_lens, pos, rows, tokens)
        if n is not None and count < n:
            raise ValueError(f"num_sequences={n} but cu_seq_lens holds {count} sequence(s)")
    else:
        assert pos is not None
        ids = _starts(pos).view(-1).cumsum(0).sub_(1).view(rows, tokens)
        if n is not None:
            require_values(ids[-1, -1] + 1 >= n, f"num_sequences={n} but position_ids start fewer sequences")
    return ids if n is None else ids.clamp(max=n)


def check_packed_labels(labels: Tensor, ids: Tensor, ignore_index: int = -100) -> None:
    """Refuse a shifted label that crosses from one packed sequence into the next.

    A causal LM shifts its labels: the last token of a sequence predicts the label of the next
    token, which in a packed row is the next sequence's first. Packed collators make that label
    ``ignore_index`` (``DataCollatorWithFlattening``'s ``separator_id``; TRL sets ``labels[position_ids
    == 0] = -100``), so no sequence learns from its neighbour; a batch whose sequences start with a
    real label would train what the same sequences unpacked never do.

    Example:
        >>> import torch
        >>> ids = torch.tensor([[0, 0, 1, 1]])
        >>> check_packed_labels(torch.tensor([[-100, 3, -100, 4]]), ids)   # fine
        >>> try:
        ...     check_packed_labels(torch.tensor([[-100, 3, 9, 4]]), ids)
        ... except ValueError as e:
        ...     print(str(e).split(" (")[0])
        labels: a packed sequence starts with a label, not -100
    """
    crossing = (ids[:, 1:] != ids[:, :-1]) & (labels[:, 1:].to(ids.device) != ignore_index)
    require_values(
        ~crossing.any(),
        f"labels: a packed sequence starts with a label, not {ignore_index} (the shifted loss would "
        "train the previous sequence's last token to predict it): set each packed sequence's first "
        f"label to {ignore_index}, as DataCollatorWithFlattening (separator_id) and TRL's padding-free "
        "collator do",
    )


def _ids_from_cu(cu: Any, pos: Tensor | None, rows: int, tokens: int) -> tuple[Tensor, int]:
    """The numbering ``cu`` (``cu_seq_lens``) gives, and its sequence count; ``cu`` checked (1-D, from 0
    to ``rows * tokens``, strictly increasing, a boundary at each row) and against ``pos`` when given."""
    if not isinstance(cu, Tensor) or cu.dtype not in INTEGER_DTYPES or cu.dim() != 1:
        got = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, Tensor) else type(cu).__name__
        raise TypeError(f"cu_seq_lens must be a 1-D integer tensor, got {got}")
    if cu.numel() < 2:
        raise ValueError("cu_seq_lens must hold at least [0, total tokens]")
    cu = cu.long()
    total = rows * tokens
    ok = (cu[0] == 0) & (cu[-1] == total) & (cu.diff() > 0).all()
    if rows > 1:  # each row's first token starts a sequence
        ok &= torch.isin(torch.arange(0, total, tokens, device=cu.device), cu).all()
    require_values(
        ok,
        f"cu_seq_lens must run from 0 to the batch's {total} tokens ({rows} row(s) of {tokens}), strictly "
        "increasing, with a boundary at every row's start: pass the cu_seq_lens_q the collator made "
        "for this batch",
    )
    flat = torch.arange(total, device=cu.device)
    ids = torch.searchsorted(cu[1:-1].contiguous(), flat, right=True).view(rows, tokens)
    if pos is not None:
        require_values(
            (_starts(pos) == _starts(ids.to(pos.device), 0)).all(),
            "position_ids and cu_seq_lens disagree on where the packed sequences start: pass the "
            "ones the collator made for this batch (cu_seq_lens_q), or only one of them",
        )
    return ids, cu.numel() - 1


def _check_positions(position_ids: Any, rows: int, tokens: int) -> Tensor:
    """``position_ids`` as ``(rows, tokens)`` integers whose sequences all start at the same position."""
    if not isinstance(position_ids, Tensor) or position_ids.dtype not in INTEGER_DTYPES:
        got = getattr(position_ids, "dtype", type(position_ids).__name__)
        raise TypeError(f"position_ids must be an integer tensor, got {got}")
    if position_ids.dim() != 2 or position_ids.shape[1] != tokens or position_ids.shape[0] not in (1, rows):
        raise ValueError(
            f"position_ids must have shape ({rows}, {tokens}) (or (1, {tokens})) like labels, "
            f"got {tuple(position_ids.shape)}"
        )
    pos = position_ids.expand(rows, tokens)
    require_values(
        (pos.masked_select(_starts(pos)) == pos[0, 0]).all(),
        "position_ids: every packed sequence must start at the batch's first position (here "
        "position_ids[0, 0]); these restart elsewhere, as left-padded or shifted position ids do. "
        "Pass the packing collator's position_ids, or none for a padded batch",
    )
    return pos


def _starts(x: Tensor, step: int = 1) -> Tensor:
    """Where a sequence starts: each row's first token, and wherever ``x`` does not go up by ``step``
    (1 for positions, 0 for sequence ids)."""
    starts = torch.ones_like(x, dtype=torch.bool)
    starts[:, 1:] = x[:, 1:] - x[:, :-1] != step
    return starts
