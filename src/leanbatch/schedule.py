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
    Its ``state_dict`` holds plain values only (loads with ``torch.load(weights_only=True)``):
    the progress source and ``lr_lambda`` stay the constructor's.

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
        if not callable(progress) and not hasattr(progress, "progress"):
            raise TypeError("progress must be a callable or an object with a .progress attribute (InfoBatch)")
        if not callable(lr_lambda):
            raise TypeError(
                f"lr_lambda must be a function of progress in [0, 1] returning the LR multiplier, e.g. "
                f"leanbatch.cosine(), got {type(lr_lambda).__name__} {lr_lambda!r}"
            )

        def multiplier(_step: int) -> float:
            """``lr_lambda(progress)``, both checked: a NaN progress or LR would silently wreck the weights."""
            done = progress() if callable(progress) else float(progress.progress)
            t = check_real(done, "progress", hint="the fraction of training done, in [0, 1]")
            return check_real(lr_lambda(t), "lr_lambda(progress)", 0.0, hint="an LR multiplier")

        # a closure, not attributes: LambdaLR's state_dict leaves it out (plain values only)
        super().__init__(optimizer, multiplier)
