"""When selection runs: Composer's window-and-interrupt rule and a training-progress helper.

Selection is active while ``start <= progress < end`` (fractions of training),
except on *interrupt* batches, which train on the whole batch. The interrupt rule
is Composer's code, exactly: batch ``batch_idx`` (0-based, counted within the
epoch) is a vanilla batch when ``(batch_idx + 1) % interrupt == 0``. So:

- ``interrupt=0``: never interrupted - every batch in the window is selected;
- ``interrupt=1``: every batch is vanilla - selection never runs;
- ``interrupt=2`` (default): selection and vanilla batches alternate
  (batches 0, 2, 4, ... selected; 1, 3, 5, ... vanilla);
- ``interrupt=n``: in each run of ``n`` batches, the first ``n - 1`` are
  selected and the ``n``-th is vanilla.

(Composer's README says ``interrupt=2`` "performs a standard training batch
after every two batches of Selective Backprop"; its code alternates.)
"""

from __future__ import annotations

from leanbatch.selection._checks import check_int

__all__ = ["should_selective_backprop", "training_progress"]


def should_selective_backprop(
    current_duration: float, batch_idx: int, start: float = 0.5, end: float = 0.9, interrupt: int = 2
) -> bool:
    """Whether selection runs on this batch (Composer's rule and signature).

    True when ``start <= current_duration < end`` and the batch is not an
    interrupt batch, i.e. ``interrupt == 0`` or ``(batch_idx + 1) % interrupt != 0``.

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


def training_progress(
    *,
    epoch: int | None = None,
    num_epochs: int | None = None,
    batch_idx: int = 0,
    batches_per_epoch: int | None = None,
    step: int | None = None,
    total_steps: int | None = None,
) -> float:
    """Fraction of training done, from an epoch position or from a step count.

    ``(epoch + batch_idx / batches_per_epoch) / num_epochs`` (whole epochs only
    when ``batches_per_epoch`` is not given), or ``step / total_steps``.

    Example:
        >>> training_progress(epoch=5, num_epochs=10, batch_idx=50, batches_per_epoch=100)
        0.55
        >>> training_progress(step=300, total_steps=1000)
        0.3
    """
    if step is not None or total_steps is not None:
        if step is None or total_steps is None:
            raise TypeError("pass both step= and total_steps=")
        check_int(step, "step", 0)
        check_int(total_steps, "total_steps", 1)
        return step / total_steps
    if epoch is None or num_epochs is None:
        raise TypeError(
            "pass epoch= and num_epochs= (optionally batch_idx=, batches_per_epoch=), or step=/total_steps="
        )
    check_int(epoch, "epoch", 0)
    check_int(num_epochs, "num_epochs", 1)
    frac = 0.0
    if batches_per_epoch is not None:
        frac = check_int(batch_idx, "batch_idx", 0) / check_int(batches_per_epoch, "batches_per_epoch", 1)
    return (epoch + frac) / num_epochs
