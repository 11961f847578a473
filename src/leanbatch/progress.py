"""Training progress: the fraction of training done, in one formula every part of leanbatch reads.

``progress = (epoch + done / length) / num_epochs``, clamped to [0, 1]: ``done`` of ``length``
units (samples, batches) of epoch ``epoch`` are trained. InfoBatch's training record counts
trained samples, the Lightning adapter counts the Trainer's batches, the benchmark counts its
steps; all of them call :func:`training_progress`. Selective Backprop's window, ``ProgressLR``
and the adapters' schedules read the result.

Example:
    >>> training_progress(epoch=5, num_epochs=10, batch_idx=50, batches_per_epoch=100)
    0.55
    >>> training_progress(step=300, total_steps=1000)
    0.3
"""

from __future__ import annotations

from typing import NamedTuple

from leanbatch.checks import check_int

__all__ = ["Position", "training_progress"]


def training_progress(
    *,
    epoch: int | None = None,
    num_epochs: int | None = None,
    batch_idx: int = 0,
    batches_per_epoch: int | None = None,
    step: int | None = None,
    total_steps: int | None = None,
) -> float:
    """Fraction of training done, from an epoch position or from a step count, in [0, 1].

    ``(epoch + batch_idx / batches_per_epoch) / num_epochs`` (whole epochs only when
    ``batches_per_epoch`` is not given, or is 0: an epoch not planned yet), or
    ``step / total_steps``. Training past the end reads 1.0.

    Example:
        >>> training_progress(epoch=2, num_epochs=4), training_progress(epoch=5, num_epochs=4)
        (0.5, 1.0)
    """
    if step is not None or total_steps is not None:
        if step is None or total_steps is None:
            raise TypeError("pass both step= and total_steps=")
        return min(1.0, check_int(step, "step", 0) / check_int(total_steps, "total_steps", 1))
    if epoch is None or num_epochs is None:
        raise TypeError(
            "pass epoch= and num_epochs= (optionally batch_idx=, batches_per_epoch=), or step=/total_steps="
        )
    check_int(epoch, "epoch", 0)
    check_int(num_epochs, "num_epochs", 1)
    frac = 0.0
    if batches_per_epoch:
        frac = check_int(batch_idx, "batch_idx", 0) / check_int(batches_per_epoch, "batches_per_epoch", 1)
    return min(1.0, (epoch + frac) / num_epochs)


class Position(NamedTuple):
    """Where training stands: ``trained`` of the ``length`` samples of epoch ``epoch`` (global order).

    ``length`` is 0 while the epoch is not planned yet. A fully trained epoch ``e`` reads
    ``Position(e + 1, 0, ...)``.

    Example:
        >>> Position(2, 30, 120).fraction
        0.25
    """

    epoch: int
    trained: int
    length: int

    @property
    def fraction(self) -> float:
        """The share of the epoch trained (0 while it is not planned)."""
        return self.trained / self.length if self.length else 0.0
