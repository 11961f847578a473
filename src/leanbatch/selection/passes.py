"""The selection forward pass with one object's settings, checked once.

:class:`SelectionPass` holds what the scoring pass of
:class:`~leanbatch.selection.SelectiveBackprop` needs - the loss, where input and
target are in a batch, the resolution, chunking, precision and mode - validates
it at construction, and dry-runs the pass on the first batch (:meth:`check`), so
a bad batch layout or loss fails at once, not when the selection window opens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from leanbatch.selection._checks import check_autocast, check_fraction, check_int
from leanbatch.selection.batches import slice_batch
from leanbatch.selection.layout import Key, batch_size, split_batch
from leanbatch.selection.scoring import (
    PerExampleLoss,
    as_per_example_loss,
    check_downsample,
    check_losses,
    compute_losses,
)

__all__ = ["SelectionPass"]


class SelectionPass:
    """Settings of the selection forward pass, validated; the base of ``SelectiveBackprop``.

    Args: ``scale_factor``, ``loss_fn``, ``input_key``, ``target_key``,
    ``forward_fn``, ``chunk_size``, ``autocast``, ``eval_mode``, ``scorer``, as
    documented in :class:`~leanbatch.selection.SelectiveBackprop`.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> p = SelectionPass(scale_factor=1.0, loss_fn=F.cross_entropy)
        >>> p.check((torch.randn(4, 3), torch.tensor([0, 1, 2, 0])), torch.nn.Linear(3, 3))
        >>> p.score(torch.nn.Linear(3, 3), (torch.randn(4, 3), torch.tensor([0, 1, 2, 0])), 4).shape
        torch.Size([4])
    """

    def __init__(
        self,
        *,
        scale_factor: float = 1.0,
        loss_fn: Callable[..., Tensor] | None = None,
        input_key: Key | Sequence[str] | None = None,
        target_key: Key | None = None,
        forward_fn: Callable[[Any, Any], Any] | None = None,
        chunk_size: int | None = None,
        autocast: torch.dtype | bool | None = None,
        eval_mode: bool = False,
        scorer: Callable[[Any, Any], Tensor] | None = None,
    ):
        if scorer is not None and not callable(scorer):
            raise TypeError(
                f"scorer must be callable as scorer(inputs, target) -> per-example losses, got {scorer!r}"
            )
        self.scorer = scorer
        self.scale_factor = check_fraction(scale_factor, "scale_factor")
        self.loss_fn = loss_fn
        self._default_loss = None if loss_fn is None else as_per_example_loss(loss_fn, "loss_fn")
        if input_key is not None and not isinstance(input_key, (int, str, list, tuple)):
            raise TypeError(f"input_key must be an int, a str or a list of str, got {input_key!r}")
        if target_key is not None and not isinstance(target_key, (int, str)):
            raise TypeError(f"target_key must be an int or a str, got {target_key!r}")
        self.input_key, self.target_key = input_key, target_key
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable as forward_fn(model, inputs), got {forward_fn!r}")
        self.forward_fn = forward_fn
        self.chunk_size = None if chunk_size is None else check_int(chunk_size, "chunk_size", 1)
        self.autocast = check_autocast(autocast)
        if not isinstance(eval_mode, bool):
            raise TypeError(f"eval_mode must be a bool, got {eval_mode!r}")
        self.eval_mode = eval_mode
        self._checked = False
        self._last_loss: tuple[Any, PerExampleLoss] | None = None

    @property
    def runs_model(self) -> bool:
        """Whether selection runs the model (no ``scorer``): then it needs a loss function."""
        return self.scorer is None

    def _loss(self, loss_fn: Callable[..., Tensor] | None) -> PerExampleLoss:
        if loss_fn is None:
            if self._default_loss is None:
                raise TypeError(
                    "no loss function: pass loss_fn to select() or to SelectiveBackprop(loss_fn=)"
                )
            return self._default_loss
        if self._last_loss is None or self._last_loss[0] is not loss_fn:  # checked once, not per step
            self._last_loss = (loss_fn, as_per_example_loss(loss_fn, "loss_fn"))
        return self._last_loss[1]

    def score(self, model: Any, batch: Any, n: int, loss_fn: Callable[..., Tensor] | None = None) -> Tensor:
        """Float32 selection losses of the ``n`` examples of ``batch`` (no grad, training state kept).

        With a ``scorer`` (e.g. a :class:`~leanbatch.selection.ProxyScorer`) the losses are the
        scorer's, on the batch as loaded; the model is not run.
        """
        inputs, target = split_batch(batch, self.input_key, self.target_key)
        if self.scorer is not None:
            return check_losses(self.scorer(inputs, target), n, "scorer").detach()
        return compute_losses(
            model,
            inputs,
            target,
            self._loss(loss_fn),
            n,
            scale_factor=self.scale_factor,
            chunk_size=self.chunk_size,
            autocast=self.autocast,
            eval_mode=self.eval_mode,
            forward=self.forward_fn,
        )

    def check(self, batch: Any, model: Any, loss_fn: Callable[..., Tensor] | None = None) -> None:
        """Dry-run the selection pass on (at most) two examples of ``batch``.

        Checks the batch layout, that downsampling applies to the input, that the
        model accepts the downsampled input and that the loss returns one value per
        example. Runs in eval mode under ``no_grad``; the model is left as it was.
        ``SelectiveBackprop.select`` calls it on its first batch, whatever the progress.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> from leanbatch.selection import SelectiveBackprop
            >>> sb = SelectiveBackprop()  # scale_factor=0.5 needs image-like inputs
            >>> flat_batch = (torch.randn(4, 8), torch.zeros(4, dtype=torch.long))
            >>> try:
            ...     sb.check(flat_batch, torch.nn.Linear(8, 2), F.cross_entropy)
            ... except ValueError as e:
            ...     print(str(e).split(",")[0])
            scale_factor=0.5 < 1 downsamples the model input spatially
        """
        inputs, target = split_batch(batch, self.input_key, self.target_key)
        n = batch_size(inputs, target)
        if not self.runs_model:  # nothing to dry-run (and a dry run would train a proxy scorer)
            self._checked = True
            return
        loss = self._loss(loss_fn)
        check_downsample(inputs, self.scale_factor)
        m = min(n, 2)
        compute_losses(
            model,
            slice_batch(inputs, 0, m, n),
            slice_batch(target, 0, m, n),
            loss,
            m,
            scale_factor=self.scale_factor,
            autocast=self.autocast,
            eval_mode=isinstance(model, nn.Module),
            forward=self.forward_fn,
        )
        self._checked = True
