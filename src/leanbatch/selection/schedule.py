"""When selection runs: Composer's window-and-interrupt rule.

Selection is active while ``start <= progress < end`` (fractions of training, see
:func:`leanbatch.progress.training_progress`), except on *interrupt* batches, which train on the
whole batch. The interrupt rule is Composer's code, exactly: batch ``batch_idx`` (0-based, counted
within the epoch) is a vanilla batch when ``(batch_idx + 1) % interrupt == 0``. So ``interrupt=0``
selects on every batch of the window, ``interrupt=1`` never selects, ``interrupt=2`` alternates
(0, 2, 4, ... selected) and ``interrupt=n`` makes every ``n``-th batch vanilla. (Composer's README
says ``interrupt=2`` "performs a standard training batch after every two batches of Selective
Backprop"; its code alternates.)
"""

from __future__ import annotations

import warnings
from typing import Any

from leanbatch.checks import check_int, check_interval, check_real
from leanbatch.rng import Generators

__all__ = ["Scheduled", "Window", "check_progress", "should_selective_backprop"]

_PROGRESS = (
    "the fraction of training done, e.g. leanbatch.training_progress(epoch=, num_epochs=, batch_idx=, "
    "batches_per_epoch=), which is always in [0, 1]"
)


def check_progress(progress: Any) -> float:
    """``progress`` if it is a Python number in [0, 1] (read without a device sync), else an error
    naming it.
    """
    if isinstance(progress, bool) or not isinstance(progress, (int, float)):
        raise TypeError(f"progress must be a Python float (the fraction of training done), got {progress!r}")
    return check_real(progress, "progress", 0.0, 1.0, hint=_PROGRESS)


def should_selective_backprop(
    current_duration: float, batch_idx: int, start: float = 0.5, end: float = 0.9, interrupt: int = 2
) -> bool:
    """Whether selection runs on this batch (Composer's rule and signature).

    Example:
        >>> [should_selective_backprop(0.6, i, interrupt=2) for i in range(4)]
        [True, False, True, False]
        >>> [should_selective_backprop(0.6, i, interrupt=3) for i in range(6)]
        [True, True, False, True, True, False]
        >>> should_selective_backprop(0.95, 0), should_selective_backprop(0.6, 1, interrupt=0)
        (False, True)
    """
    in_window = start <= current_duration < end
    return in_window and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)


class Window:
    """The schedule of a selector: the window ``start <= progress < end`` and the interrupt rule.

    Example:
        >>> w = Window(0.5, 0.9, interrupt=3)
        >>> [w.is_active(0.6, i) for i in range(4)], w.is_active(0.9, 0)
        ([True, True, False, True], False)
    """

    def __init__(self, start: float = 0.5, end: float = 0.9, interrupt: int = 2):
        self.start, self.end = check_interval(start, end)
        self.interrupt = check_int(interrupt, "interrupt", 0)
        if self.interrupt == 1:
            warnings.warn(
                "interrupt=1 makes every batch a vanilla batch ((batch_idx + 1) % 1 == 0): selection never "
                "runs. Use interrupt=0 to select on every batch of the window.",
                stacklevel=3,
            )

    def __repr__(self) -> str:
        return f"Window(start={self.start}, end={self.end}, interrupt={self.interrupt})"

    def is_active(self, progress: float, batch_idx: int) -> bool:
        """Whether selection runs at ``progress`` on batch ``batch_idx`` of its epoch."""
        return should_selective_backprop(progress, batch_idx, self.start, self.end, self.interrupt)


class Scheduled:
    """The window and the seed of a selector that has a :class:`Window` (``schedule``) and
    private :class:`~leanbatch.rng.Generators` (``generators``).
    """

    schedule: Window
    generators: Generators

    @property
    def seed(self) -> int:
        """The seed of the private generators."""
        return self.generators.seed

    @property
    def start(self) -> float:
        """Progress at which selection starts."""
        return self.schedule.start

    @property
    def end(self) -> float:
        """Progress at which selection stops (``start <= progress < end`` is active)."""
        return self.schedule.end
