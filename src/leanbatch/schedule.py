"""Learning-rate schedules that end exactly at the end of training.

Pruned epochs have fewer steps than full ones and how many is only known when
each epoch is planned, so a schedule built from a step count made up front
(``OneCycleLR(total_steps=epochs * len(loader))``) either stops short or, in the
official InfoBatch example, crashes with "Tried to step N times". A schedule
driven by *progress* (the fraction of training done, counted in consumed
samples) cannot: progress reaches 1.0 exactly on the last step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from leanbatch.checks import check_real

__all__ = ["ProgressLR", "cosine"]


def cosine(warmup: float = 0.0, final: float = 0.0) -> Callable[[float], float]:
    """LR multiplier for progress t in [0, 1]: linear warm-up, then cosine to ``final``.

    Example:
        >>> f = cosine(warmup=0.1)
        >>> round(f(0.05), 3), f(0.1), round(f(1.0), 6)
        (0.5, 1.0, 0.0)
    """
    check_real(warmup, "warmup", 0.0, 1.0, high_open=True, hint="the share of training spent warming up")
    check_real(final, "final", 0.0, hint="the LR multiplier reached at the end of training (0 = to zero)")

    def f(t: float) -> float:
        t = min(max(check_real(t, "progress", hint="the fraction of training done, in [0, 1]"), 0.0), 1.0)
        if t < warmup:
            return t / warmup
        u = (t - warmup) / (1.0 - warmup)
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * u))

    return f


class ProgressLR(LambdaLR):
    """``LambdaLR`` whose multiplier is a function of training progress, not of step count.

    Args:
        optimizer: the optimizer.
        progress: an object with a ``progress`` attribute in [0, 1] (an
            :class:`~leanbatch.InfoBatch`) or a zero-argument callable returning it.
        lr_lambda: multiplier as a function of progress, e.g. :func:`cosine`.

    Call ``scheduler.step()`` after each ``optimizer.step()`` as usual; it never
    raises for stepping "too often", and the last step lands on ``lr_lambda(1.0)``.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> done = [0.0]
        >>> sched = ProgressLR(opt, lambda: done[0], cosine())
        >>> opt.step(); done[0] = 1.0; sched.step()
        >>> round(opt.param_groups[0]["lr"], 6)
        0.0
    """

    def __init__(self, optimizer: Optimizer, progress: Any, lr_lambda: Callable[[float], float]):
        if callable(progress):
            self._progress: Callable[[], float] = progress
        elif hasattr(progress, "progress"):
            self._progress = lambda: float(progress.progress)
        else:
            raise TypeError("progress must be a callable or an object with a .progress attribute (InfoBatch)")
        if not callable(lr_lambda):
            raise TypeError(
                f"lr_lambda must be a function of progress in [0, 1] returning the LR multiplier, e.g. "
                f"leanbatch.cosine(), got {type(lr_lambda).__name__} {lr_lambda!r}"
            )
        self._fn = lr_lambda
        super().__init__(optimizer, self._multiplier)

    def _multiplier(self, _step: int) -> float:
        """``lr_lambda(progress)``, both checked: a NaN progress or LR would silently wreck the weights."""
        t = check_real(self._progress(), "progress", hint="the fraction of training done, in [0, 1]")
        return check_real(self._fn(t), "lr_lambda(progress)", 0.0, hint="an LR multiplier")

    # The progress source and the shape are code, rebuilt by the constructor: the state holds
    # plain values only, so it saves with torch.save and loads with weights_only=True (framework
    # checkpoints: Lightning, Hugging Face).
    _CODE = ("_fn", "_progress", "_multiplier")

    def state_dict(self) -> dict[str, Any]:
        """``LambdaLR``'s state without the progress source and shape (plain values only).

        Example:
            >>> import io, torch
            >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
            >>> sched = ProgressLR(opt, lambda: 0.5, cosine())
            >>> buf = io.BytesIO(); torch.save(sched.state_dict(), buf); _ = buf.seek(0)
            >>> sched.load_state_dict(torch.load(buf, weights_only=True)); sched.last_epoch
            0
        """
        return {k: v for k, v in super().state_dict().items() if k not in self._CODE}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the progress source and shape stay this object's."""
        super().load_state_dict({k: v for k, v in state_dict.items() if k not in self._CODE})
