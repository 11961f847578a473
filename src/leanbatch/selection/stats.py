"""Counters of what selection did. Every count is a host-side integer selection already knows
(batch sizes, the fixed ``k``, the length of the kept positions): keeping them reads nothing from
the device. Times are measured only with ``timing=True``: timing a CUDA step means synchronising.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SelectionStats"]


@dataclass
class SelectionStats:
    """What selection did so far.

    Attributes:
        batches: batches passed to ``select``.
        selected_batches: of those, batches where selection ran (inside the
            window and not an ``interrupt`` batch).
        examples: examples in all batches.
        forwarded: examples that went through the selection forward pass.
        reused: examples whose stale loss was reused (Stale-SB: forward skipped).
        backpropagated: examples handed to the training step (selected ones plus
            every example of a batch where selection did not run).
        skipped: examples dropped by selection (no backward pass).
        filled: of ``backpropagated``, rows a rank trained only because a global choice
            (``scope="global"``) left it none: its hardest row, weight 0 in ``step_loss``, so
            DDP's backward runs on every rank.
        selection_time_s: seconds spent in selection (``timing=True`` only).
        step_time_s: seconds spent inside ``step_timer()`` blocks.

    Example:
        >>> s = SelectionStats(batches=2, examples=256, selected_batches=1, forwarded=128,
        ...                    backpropagated=192, skipped=64)
        >>> s.backprop_fraction, s.forward_fraction
        (0.75, 0.5)
    """

    batches: int = 0
    selected_batches: int = 0
    examples: int = 0
    forwarded: int = 0
    reused: int = 0
    backpropagated: int = 0
    skipped: int = 0
    filled: int = 0
    selection_time_s: float = 0.0
    step_time_s: float = 0.0

    @property
    def backprop_fraction(self) -> float:
        """Fraction of all examples seen that got a backward pass."""
        return self.backpropagated / self.examples if self.examples else 0.0

    @property
    def forward_fraction(self) -> float:
        """Extra selection forwards per example seen."""
        return self.forwarded / self.examples if self.examples else 0.0

    @property
    def selection_overhead(self) -> float | None:
        """Selection time relative to training-step time (``None`` until both were timed)."""
        if self.step_time_s <= 0.0 or self.selection_time_s <= 0.0:
            return None
        return self.selection_time_s / self.step_time_s

    def as_dict(self) -> dict[str, Any]:
        """Plain values, derived fractions included."""
        derived = ("backprop_fraction", "forward_fraction", "selection_overhead")
        return asdict(self) | {name: getattr(self, name) for name in derived}
