"""Where the model input and the target are in a batch, how many examples it holds, and
what a selector's ``select`` returns.

A batch is a tensor (both input and target: autoencoders), a tuple/list (input at position 0,
target at 1 by default) or a dict (Hugging Face style: the target is ``"labels"`` and the model
gets every other tensor as keywords). ``input_key`` / ``target_key`` override the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from leanbatch.selection.batches import first_tensor, is_batch

Key = int | str
Keys = tuple[Key | Sequence[str] | None, Key | None]  # (input_key, target_key)


class Selection(NamedTuple):
    """What :meth:`SelectiveBackprop.select` returns; unpacks as a 3-tuple.

    Attributes:
        batch: the batch to train on, same structure as the input (tensor,
            tuple/list or dict); every per-example tensor is cut to the kept rows.
        positions: int64 positions of the kept rows in the input batch, ascending,
            on the losses' device - or ``None`` when the batch is returned unchanged
            (outside the window, an interrupt batch, or a one-example batch).
        losses: float32 selection losses of *every* input example, shape ``(N,)``
            (stale or remembered ones included), or ``None`` when none were read (the
            uniform rule, or the batch returned unchanged).

    Example:
        >>> import torch
        >>> sel = Selection((torch.zeros(2, 3), torch.tensor([4, 5])), torch.tensor([1, 3]), torch.rand(4))
        >>> (x, y), positions, losses = sel
        >>> x.shape, positions.tolist(), sel.losses.shape
        (torch.Size([2, 3]), [1, 3], torch.Size([4]))
    """

    batch: Any
    positions: Tensor | None
    losses: Tensor | None


def split_batch(batch: Any, input_key: Key | Sequence[str] | None, target_key: Key | None) -> tuple[Any, Any]:
    """``(model inputs, target)`` of ``batch``; a clear error naming the key when one is missing."""
    if isinstance(batch, Tensor):
        return batch, batch
    if isinstance(batch, Mapping):
        tk = "labels" if target_key is None else target_key
        if tk not in batch:
            raise ValueError(f"target_key {tk!r} is not a key of the batch {list(batch)}: pass target_key=")
        if input_key is None:  # Hugging Face style: every tensor except the target, as keyword inputs
            return {k: v for k, v in batch.items() if k != tk and isinstance(v, Tensor)}, batch[tk]
        keys = list(input_key) if isinstance(input_key, (list, tuple)) else [input_key]
        missing = [k for k in keys if k not in batch]
        if missing:
            raise ValueError(f"input_key {missing} not in the batch {list(batch)}: pass input_key=")
        inputs = {k: batch[k] for k in keys} if isinstance(input_key, (list, tuple)) else batch[input_key]
        return inputs, batch[tk]
    if is_batch(batch):
        ik = 0 if input_key is None else input_key
        tk = (1 if len(batch) > 1 else 0) if target_key is None else target_key
        for name, k in (("input_key", ik), ("target_key", tk)):
            if not isinstance(k, int) or not -len(batch) <= k < len(batch):
                raise ValueError(f"{name}={k!r} does not index a batch of {len(batch)} elements")
        return batch[ik], batch[tk]  # type: ignore[index]
    raise TypeError(
        f"a batch must be a tensor, a tuple/list or a dict of tensors, got {type(batch).__name__}"
    )


def batch_size(inputs: Any, target: Any) -> int:
    """Examples in a batch: the first dimension of the input's first tensor, checked against the target."""
    lead = first_tensor(inputs)
    if lead is None:
        raise ValueError("the model input holds no tensor with a batch dimension")
    n = int(lead.shape[0])
    if n < 1:
        raise ValueError("the batch holds no example")
    t = first_tensor(target)
    if t is None or t.shape[0] != n:
        shape = None if t is None else tuple(t.shape)
        raise ValueError(f"the target must hold one entry per example ({n}), got shape {shape}")
    return n


def check_keys(input_key: Any, target_key: Any) -> Keys:
    """``(input_key, target_key)`` if they can address a batch; ``TypeError`` naming the key otherwise."""
    if input_key is not None and not isinstance(input_key, (int, str, list, tuple)):
        raise TypeError(f"input_key must be an int, a str or a list of str, got {input_key!r}")
    if target_key is not None and not isinstance(target_key, (int, str)):
        raise TypeError(f"target_key must be an int or a str, got {target_key!r}")
    return input_key, target_key


class Rows(NamedTuple):
    """One batch as a selector reads it: its model inputs and target, the number of examples, the
    device of the inputs, and the dataset indices and epoch passed with it.
    """

    inputs: Any
    target: Any
    n: int
    device: torch.device
    indices: Tensor | None = None
    epoch: int | None = None


def read_rows(batch: Any, keys: Keys | None, indices: Tensor | None = None, epoch: int | None = None) -> Rows:
    """Split ``batch`` by ``keys`` into a :class:`Rows`; ``keys=None``: no model input to find,
    the batch holds ``N`` rows along its first tensor's first dimension.

    Example:
        >>> import torch
        >>> rows = read_rows({"ids": torch.zeros(4, 3), "text": "x"}, None)
        >>> rows.n, rows.target is None
        (4, True)
    """
    if keys is None:
        if not is_batch(batch):
            raise TypeError(
                f"a batch must be a tensor, a tuple/list or a dict of tensors, got {type(batch).__name__}"
            )
        inputs, target = batch, None
        lead = first_tensor(batch)
        if lead is None:
            raise ValueError("the batch holds no tensor with a batch dimension")
        n = int(lead.shape[0])
    else:
        inputs, target = split_batch(batch, *keys)
        n = batch_size(inputs, target)
        lead = first_tensor(inputs)
    return Rows(inputs, target, n, lead.device, indices, epoch)  # type: ignore[union-attr]
