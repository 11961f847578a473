"""The errors of a loop that trains what the sampler cannot place, and the warnings a loop that
trains oddly gets once a run: one message each, naming the fix.

The sampler and its record (:mod:`leanbatch.ledger`) raise and warn; the messages live here, in one
place, so each says the same wherever it is raised.

Example:
    >>> epochs_over("update(loss)", 3)[:45]
    'update(loss): all 3 epochs are trained (num_e'
"""

from __future__ import annotations

import sys
import warnings

__all__ = [
    "epochs_over",
    "no_batch",
    "not_served",
    "size_error",
    "warn_past_end",
    "warn_skipped",
    "warn_stale_len",
    "why_not",
]


def epochs_over(what: str, num_epochs: int) -> str:
    """``what`` (an update, a commit) after every one of the ``num_epochs`` epochs was trained."""
    return (
        f"{what}: all {num_epochs} epochs are trained (num_epochs={num_epochs}); build the wrapper with "
        "num_epochs= the number of epochs you train"
    )


def not_served(what: str, n: int, in_flight: int) -> str:
    """``what`` trains ``n`` samples where only ``in_flight`` were served and not yet updated."""
    return (
        f"{what}: {n} samples but the sampler has served only {in_flight} samples not yet updated: "
        "call update() once per batch with one loss per sample (reduction='none'), or pass "
        "positions= for a selected subset of the batch"
    )


def no_batch(what: str, fetched: bool) -> str:
    """``what`` with no iteration of the sampler served (``fetched``: a batch came through the dataset)."""
    return (
        f"{what} found no batch served by this sampler: build the DataLoader with sampler=ds.sampler "
        "(not shuffle=True, which serves the epoch's samples unpruned and freezes progress inside each "
        "epoch) and iterate it" + ("" if fetched else ", or pass the batch's indices: update(loss, indices)")
    )


def size_error(subject: str, n: int, expected: int) -> str:
    """An update of ``n`` samples where the batch it trains has ``expected``."""
    return (
        f"{subject} has {n} entries but the batch it trains has {expected}: pass the whole batch, in "
        "order (one loss per sample, reduction='none', nothing filtered out), one update() per batch; "
        "for a subset of the batch pass its rows: update(loss, indices, positions=rows)"
    )


def why_not(key: tuple[int, int, int], like: tuple[int, int, int] | None, none_since: bool) -> str:
    """Why an update of the next served samples ``key`` (size, first, last index) matches no fetched
    batch: ``like``, the fetched batch most like it (None: none); ``none_since``, nothing was fetched
    in this process since the last update.

    Example:
        >>> why_not((4, 0, 3), (8, 0, 7), False)[:40]
        'loss has 4 entries but the batch it trai'
    """
    n, first, last = key
    if like is not None and like[0] != n:
        return size_error("loss", n, like[0])
    if none_since:
        return (
            f"update() was given {n} losses but no batch was fetched since the last update(): call "
            "update() once per batch, with every loss of it (for two heads, add their per-sample losses "
            "and update once; for a selected subset, update(loss, indices, positions=rows))"
        )
    return (
        f"update(loss) trains the next {n} samples ds.sampler served (dataset indices {first} .. {last}) "
        "but no batch fetched through the dataset holds them: a batch sampler that reorders or regroups "
        "ds.sampler's indices (length bucketing) needs the batch's dataset indices, update(loss, "
        "indices); otherwise pass one loss per sample of the batch (reduction='none'), one update() "
        "per batch"
    )


_OURS = ("leanbatch", "torch")  # packages whose frames a warning looks past


def _once(warned: set[str], what: str, message: str, category: type[Warning] = UserWarning) -> None:
    """Give the warning ``what`` unless ``warned`` (the run's) holds it, at the first line outside
    leanbatch and torch (the user's ``set_epoch``, ``len(loader)``, ``for batch in loader``), however
    many frames of ours (the wrapper, the sampler) or of a DataLoader stand between."""
    if what in warned:
        return
    warned.add(what)
    frame, level = sys._getframe(1), 2  # the stacklevel of this function's caller
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _OURS:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def warn_past_end(warned: set[str], num_epochs: int, epoch: int) -> None:
    """Warn (once per run: ``warned`` holds those given) that ``epoch`` is past ``num_epochs``.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always"); warn_past_end(set(), 2, 2)
        >>> "all 2 epochs" in str(w[0].message)
        True
    """
    message = (
        f"all {num_epochs} epochs (num_epochs={num_epochs}) are trained: epoch {epoch} serves nothing "
        "(training on would run at progress 1.0, where a ProgressLR schedule is at its end); build the "
        "wrapper with num_epochs= the number of epochs you train"
    )
    _once(warned, "past_end", message, RuntimeWarning)


def warn_skipped(warned: set[str], epoch: int, next_epoch: int, num_epochs: int) -> None:
    """Warn (once per run) that ``set_epoch(epoch)`` skips untrained epochs from ``next_epoch`` on."""
    skipped = f"epoch {next_epoch}" if epoch == next_epoch + 1 else f"epochs {next_epoch} .. {epoch - 1}"
    message = (
        f"set_epoch({epoch}) skips {skipped}, which trained nothing: epochs are 0-based (for epoch in "
        f"range({num_epochs}): ds.set_epoch(epoch)); a 1-based loop skips epoch 0 and its warm-up and "
        "trains nothing in its last epoch"
    )
    _once(warned, "skip", message)


def warn_stale_len(warned: set[str], finished: int, read: int, epoch: int, length: int) -> None:
    """Warn (once per run) that a length read between epochs was the finished epoch's, not the next's.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always"); warn_stale_len(set(), 0, 96, 1, 60)
        >>> "ds.set_epoch(epoch)" in str(w[0].message)
        True
    """
    message = (
        f"len() read after epoch {finished}'s last step gave {read} samples, epoch {finished}'s, but "
        f"epoch {epoch}, which begins now, serves {length}: with DataLoader worker processes (or any "
        "loader that reads ahead) the sampler cannot see that the loop's pass is over, so a length read "
        "between epochs is the finished epoch's, and a schedule built from it (OneCycleLR("
        "steps_per_epoch=len(loader))) has the wrong number of steps. Call ds.set_epoch(epoch) at the "
        "top of each epoch, before reading len(loader)"
    )
    _once(warned, "stale_len", message)
