"""Dataset indices that travel with Hugging Face batches and never reach the model.

:class:`IndexedDataset` tags each item with its index (kept through ``remove_unused_columns`` as a
signature column); :class:`IndexCollator` takes the tags out before the user's collator runs and
attaches the batch's indices as one :class:`Rows`. ``Rows`` is not a tensor and has no ``.to``, so
neither accelerate nor the Trainer moves it: the indices stay on the CPU, read with no device sync.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from leanbatch.hf.packed import sequences_per_item
from leanbatch.indexed import WithIndex, untag

__all__ = ["INDEX_KEY", "IndexCollator", "IndexedDataset", "Rows"]

INDEX_KEY = "leanbatch_index"
"""The batch key under which each batch carries its :class:`Rows` (removed before ``forward``)."""


@dataclass(slots=True, eq=False, repr=False)
class Rows:
    """The dataset indices of one collated batch, carried beside the model inputs.

    Attributes:
        indices: int64 CPU tensor ``(n,)``, the dataset index of every row as collated.
        labelled: bool CPU tensor ``(n,)``: the row has at least one labelled token (a
            label other than -100 among those the loss uses); rows without one get no score.
        positions: rows Selective Backprop kept for the training pass (on the batch's
            device), or ``None`` when the whole batch is trained.
        sequences: int64 CPU tensor ``(n,)``, the packed sequences each sample makes when the
            collator packs the batch (:func:`leanbatch.hf.packed.sequences_per_item`), or ``None``.

    Example:
        >>> import torch
        >>> rows = Rows(torch.tensor([7, 3, 5]), torch.tensor([True, False, True]))
        >>> len(rows), rows
        (3, Rows([7, 3, 5]))
    """

    indices: Tensor
    labelled: Tensor
    positions: Tensor | None = None
    sequences: Tensor | None = None

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        return f"Rows({self.indices.tolist()})"


class IndexedDataset(WithIndex):
    """``dataset[i]`` with its index ``i`` attached, for the training loader only: the core's
    :class:`~leanbatch.indexed.WithIndex` with the key :data:`INDEX_KEY` and the items kept apart
    (``flat=False``): a dict item gets the key, any other item is wrapped so that the collator
    can untag it. Nothing else of the wrapped dataset is exposed (in particular no ``set_epoch``,
    which accelerate would call with its own epoch numbers).

    Example:
        >>> ds = IndexedDataset([{"input_ids": [1, 2]}, {"input_ids": [3]}])
        >>> len(ds), ds[1]
        (2, {'input_ids': [3], 'leanbatch_index': 1})
    """

    def __init__(self, dataset: Any):
        super().__init__(dataset, INDEX_KEY, flat=False)


class IndexCollator:
    """Wraps the Trainer's collator: untags the items, collates them, attaches :class:`Rows`.

    Batches of untagged items (evaluation, prediction) go through the wrapped collator as
    they are. ``shift`` says whether the loss predicts token ``t + 1`` at position ``t``
    (causal language models), which decides whether a row's first label counts.

    Example:
        >>> import torch
        >>> def collate(items):
        ...     return {"labels": torch.tensor([it["labels"] for it in items])}
        >>> items = IndexedDataset([{"labels": [5, 6]}, {"labels": [-100, 6]}, {"labels": [4, -100]}])
        >>> batch = IndexCollator(collate, shift=True)([items[0], items[1], items[2]])
        >>> batch["leanbatch_index"], batch["leanbatch_index"].labelled.tolist()
        (Rows([0, 1, 2]), [True, True, False])
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any], shift: bool):
        self.collate_fn = collate_fn
        self.shift = shift

    def __call__(self, features: list[Any]) -> Any:
        tagged = untag(features, INDEX_KEY)
        if tagged is None:
            return self.collate_fn(features)
        items, indices = tagged
        batch = self.collate_fn(items)
        if not isinstance(batch, MutableMapping):
            raise TypeError(
                f"the data collator returned a {type(batch).__name__}; the Trainer (and leanbatch.hf) need a "
                "dict of model inputs, e.g. {'input_ids': ..., 'attention_mask': ..., 'labels': ...}"
            )
        labels, n = batch.get("labels"), len(indices)
        if not isinstance(labels, Tensor) or labels.dim() == 0 or labels.shape[0] != n:
            labelled = torch.ones(n, dtype=torch.bool)  # no token labels here: the loss says what is wrong
        else:
            labelled = (labels[:, 1:] if self.shift and labels.dim() > 1 else labels) != -100
            labelled = labelled.reshape(n, -1).any(dim=1).cpu()
        idx = torch.tensor(indices, dtype=torch.int64)
        batch[INDEX_KEY] = Rows(idx, labelled, sequences=sequences_per_item(items))
        return batch
