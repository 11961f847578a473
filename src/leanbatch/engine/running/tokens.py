"""The token hook: ``loss = run.token_loss(ds, logits, labels, reference=...)`` for a causal language model.

A token arm (``token-selection`` and its twin ``token-selection[policy=random]``) trains the
``keep`` share of each batch's labelled tokens its :class:`~leanbatch.TokenSelection` chooses;
every other arm trains each sequence's mean token loss through its data (InfoBatch's scores and
weights, a budget's steps). The loop reads the same for every arm::

    logits = model(x)                                        # (rows, T, vocab)
    loss = run.token_loss(ds, logits, x, indices=idx, reference=lambda: reference_model(x))
    opt.zero_grad(); loss.backward(); opt.step()

``reference``: a function returning the reference model's logits on the same inputs, called only
when token selection ranks by excess loss on this batch (never for the twin, nor outside the
schedule's window); each call is work, charged to the run (``run.charge``: its rows forwarded, at
``reference_cost`` FLOPs of one of the model's forwards), so the judge sees what it cost.
Token selection forwards and backpropagates every row: its work is the baseline's and more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from leanbatch import TokenSelection, per_sequence_loss

__all__ = ["token_step"]


def token_step(
    progress: float,
    charge: Callable[..., None],
    selection: TokenSelection | None,
    data: Any,
    logits: Tensor,
    labels: Tensor | None,
    shift_labels: Tensor | None,
    indices: Tensor | None,
    reference: Callable[[], Tensor] | None,
    reference_cost: float,
) -> Tensor:
    """One training step's loss at ``progress``: the arm's token ``selection``'s (``None``: every
    arm but the token arms), or its ``data``'s per-sequence update; ``charge``: the run's
    ``run.charge``, for the reference's forwards. See the module docstring."""
    if selection is None:  # every arm but the token arms: one loss per sequence, through the data
        if labels is not None and shift_labels is not None:
            raise TypeError(
                "pass labels= (shifted here) or shift_labels= (already shifted), exactly one of them"
            )
        given, shift = (labels, True) if shift_labels is None else (shift_labels, False)
        if given is None:
            raise TypeError("run.token_loss needs the labels: labels= (shifted here) or shift_labels=")
        per_seq = per_sequence_loss(logits, given, shift=shift)
        return data.update(per_seq) if indices is None else data.update(per_seq, indices)
    ref = None
    if reference is not None and selection.policy == "excess" and selection.is_active(progress):
        with torch.no_grad():
            out = reference()
        ref = getattr(out, "logits", out)  # a Hugging Face model's output, or the logits
        charge(forwarded=int(logits.shape[0]), cost=reference_cost)
    loss = selection.loss(logits, labels, shift_labels=shift_labels, progress=progress, reference_logits=ref)
    # the arm's data counts the step (every row is forwarded and backpropagated): its update of R
    # copies of the loss returns their mean, the loss itself, with its gradient
    rows = int(logits.shape[0])
    return data.update(loss.expand(rows)) if indices is None else data.update(loss.expand(rows), indices)
