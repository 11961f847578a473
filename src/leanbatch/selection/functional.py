"""Composer's functional form of Selective Backprop, sync-free and state-preserving.

``select_using_loss(X, y, model, loss_fun, keep, scale_factor)`` has the same
signature and meaning as ``composer.functional``'s, so switching is an import
change. What differs is underneath: sampling on the device with a private
generator (no numpy, no global RNG, no host-device sync), BatchNorm statistics
and train/eval modes left exactly as they were, at least one example kept, and
optional chunking and precision for the selection pass.

What Composer's callers pass also works here: an input batch ``X`` that is a
dict (Hugging Face style; the model is called as ``model(X)`` with the dict, as
Composer calls it, and every per-example tensor of the dict is cut to the kept
rows) and a loss returning integers (Composer's own tests use
``torch.ones_like(target)``; integer losses are ranked as floats).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from leanbatch.selection.batches import first_tensor, index_batch
from leanbatch.selection.rules import num_selected, resolve_generator, select_indices
from leanbatch.selection.scoring import check_downsample, check_model
from leanbatch.selection.sources import ForwardScores

__all__ = ["select_using_loss", "selection_losses"]


def _nodes(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, node)`` of every value below a dict, containers and leaves, e.g. ``("X['ids']", tensor)``."""
    if isinstance(value, (tuple, list)):
        value = dict(enumerate(value))
    for k, v in value.items() if isinstance(value, Mapping) else ():
        p = f"{path}[{k!r}]"
        yield p, v
        yield from _nodes(v, p)


def _check_pair(X: Any, y: Any, scale_factor: float) -> int:
    """``N``, the examples of Composer's ``(X, y)`` once checked: ``X``'s first dimension, or for a
    dict ``X`` the length of ``y`` (its tensors of a batch dimension must all hold ``N`` rows)."""
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor batch of targets, got {type(y).__name__}")
    if isinstance(X, Mapping):
        if y.dim() == 0 or y.shape[0] < 1:
            raise ValueError(f"y must hold one target per example, got shape {tuple(y.shape)}")
        n = int(y.shape[0])
        nodes = list(_nodes(X, "X"))
        rows = [(p, t) for p, t in nodes if isinstance(t, Tensor) and t.dim() > 0]
        bad = [f"{p} has {t.shape[0]} rows" for p, t in rows if t.shape[0] != n]
        if not rows or bad:
            raise ValueError(
                f"every tensor of a dict X must hold one row per example ({n}, the length of y) - it is "
                f"cut to the selected rows; got {'; '.join(bad) or 'no tensor with a batch dimension'}"
            )
        lists = [p for p, v in nodes if isinstance(v, (list, tuple)) and len(v) == n and n > 1]
        if lists:
            raise ValueError(
                f"{lists[0]} is a {n}-item list: it looks per-example but only tensors are cut to the "
                "selected rows, so it would no longer match them; make it a tensor or take it out of X"
            )
        if scale_factor < 1.0:
            raise ValueError(
                f"scale_factor={scale_factor} < 1 downsamples X, which needs X to be a tensor of images; "
                "with a dict X use scale_factor=1 (Composer cannot downsample a dict either), or "
                "SelectiveBackprop(input_key=...), which downsamples the image tensors of a dict batch"
            )
        return n
    if not isinstance(X, Tensor):
        raise TypeError(
            f"X must be a torch.Tensor batch of inputs or a dict of them (the model then gets the dict), "
            f"got {type(X).__name__}"
        )
    if X.dim() == 0 or X.shape[0] < 1:
        raise ValueError(f"X must hold at least one example along dim 0, got shape {tuple(X.shape)}")
    if y.dim() == 0 or y.shape[0] != X.shape[0]:
        raise ValueError(
            f"y must have one target per example of X ({X.shape[0]}), got shape {tuple(y.shape)}"
        )
    check_downsample(X, scale_factor)
    return int(X.shape[0])


def _call_with_dict(model: Callable[..., Any], X: Any) -> Any:
    """Composer's ``model(X)``, also for a dict ``X``, with a hint when the model wants keywords."""
    if not isinstance(X, Mapping):
        return model(X)
    try:
        return model(X)
    except (TypeError, AttributeError) as err:
        raise TypeError(
            f"model(X) failed with the dict X ({type(err).__name__}: {err}). select_using_loss passes the "
            "whole dict, as Composer does; for a model that takes keyword inputs (a bare Hugging Face "
            "model) pass model=lambda X: hf_model(**X)"
        ) from err


def _forward(
    loss_fun: Any, scale_factor: float, chunk_size: int | None, autocast: Any, eval_mode: bool
) -> ForwardScores:
    """The selection forward with Composer's names: the loss is ``loss_fun``, the model gets ``X`` whole."""
    return ForwardScores(
        scale_factor,
        loss_fun,
        forward_fn=_call_with_dict,
        chunk_size=chunk_size,
        autocast=autocast,
        eval_mode=eval_mode,
        loss_name="loss_fun",
    )


def selection_losses(
    X: Tensor,
    y: Tensor,
    model: Callable[..., Any],
    loss_fun: Callable[..., Tensor],
    scale_factor: float = 1,
    *,
    chunk_size: int | None = None,
    autocast: torch.dtype | bool | None = None,
    eval_mode: bool = False,
) -> Tensor:
    """Per-example losses of the selection pass (no grad, training state untouched), float32 ``(N,)``.

    The lower-level half of :func:`select_using_loss`: pair it with
    :func:`select_indices` when the loop needs the losses too (e.g. to feed
    InfoBatch's score table). Arguments as in :func:`select_using_loss`.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
        ...                             torch.nn.Flatten(), torch.nn.Linear(4, 10))
        >>> X, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        >>> selection_losses(X, y, model, F.cross_entropy, scale_factor=0.5).shape
        torch.Size([8])
    """
    fwd = _forward(loss_fun, scale_factor, chunk_size, autocast, eval_mode)
    check_model(model, loss_fun, "loss_fun")
    return fwd.losses(model, X, y, _check_pair(X, y, fwd.scale_factor))


def select_using_loss(
    X: Tensor,
    y: Tensor,
    model: Callable[..., Any],
    loss_fun: Callable[..., Tensor],
    keep: float = 0.5,
    scale_factor: float = 1,
    *,
    generator: torch.Generator | None = None,
    chunk_size: int | None = None,
    autocast: torch.dtype | bool | None = None,
    eval_mode: bool = False,
) -> tuple[Tensor, Tensor]:
    """Keep the examples of a batch that Selective Backprop's rank rule draws (Composer's signature).

    One no-grad forward scores every example; ``max(1, int(keep * N))`` are drawn without
    replacement, rank position ``i`` (ascending loss) by weight ``((i + 0.5) / N) ** (1 / keep - 1)``.

    Args:
        X: inputs ``(N, ...)``, or a dict of them (Hugging Face style, ``N = len(y)``) passed whole
            to ``model`` (for a bare HF model pass ``lambda X: hf_model(**X)``): its tensors of
            ``N`` rows are cut to the kept rows, other values kept; a dict needs ``scale_factor=1``.
        y: targets, ``(N, ...)``.
        loss_fun: ``loss_fun(output, target, reduction="none") -> (N,)``, e.g. ``F.cross_entropy``,
            or a loss module; integer losses rank as floats.
        keep: fraction kept, in (0, 1]; ``scale_factor``: in (0, 1], the selection forward sees
            ``X`` downsampled (3-D to 5-D float inputs).
        generator: on ``X``'s device; default: a private seeded stream (never the global RNG).
        chunk_size, autocast, eval_mode: as in :class:`~leanbatch.selection.SelectiveBackprop`.

    Returns ``(X_selected, y_selected)``, rows in batch order (a dict ``X`` as its own mapping
    type); with every example kept (``keep=1`` or ``N=1``) the batch as is, without a forward.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
        ...                             torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 10))
        >>> X, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
        >>> X_new, y_new = select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
        >>> X_new.shape, y_new.shape
        (torch.Size([8, 1, 28, 28]), torch.Size([8]))
        >>> X_dict = {"input_ids": torch.arange(16).view(8, 2), "task": "toy"}  # dict batch, integer loss
        >>> X_d, y_d = select_using_loss(X_dict, torch.arange(8), lambda X: X["input_ids"].float(),
        ...                              lambda out, y, reduction="none": y, keep=0.5)
        >>> X_d["task"], torch.equal(X_d["input_ids"][:, 0], 2 * y_d), len(y_d)
        ('toy', True, 4)
    """
    fwd = _forward(loss_fun, scale_factor, chunk_size, autocast, eval_mode)
    check_model(model, loss_fun, "loss_fun")  # even when every example is kept, without a forward
    n = _check_pair(X, y, fwd.scale_factor)
    k = num_selected(n, keep)
    resolve_generator(generator, first_tensor(X).device)  # type: ignore[union-attr]  # a wrong generator fails now, whatever the batch
    if k == n:
        return X, y
    positions = select_indices(fwd.losses(model, X, y, n), keep, generator)
    return index_batch(X, positions, n), index_batch(y, positions, n)
