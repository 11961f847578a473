"""The methods the benchmark compares, and how a method is written on the command line.

``--methods`` takes a comma-separated list. Each item is a method name, optionally
followed by hyperparameter overrides in brackets, which also makes it a separate
row of the table::

    baseline,random,infobatch,sb,infobatch+sb
    baseline,infobatch,infobatch+sb[sb_start=0.2,sb_keep=0.7]

Hyperparameters (defaults are the published ones):

- ``prune_ratio`` (0.5), ``delta`` (0.875): InfoBatch / random pruning (Qin et al., ICLR 2024).
- ``sb_keep`` (0.5), ``sb_start`` (0.5), ``sb_end`` (0.9), ``sb_scale`` (0.5), ``sb_interrupt`` (2):
  Selective Backprop as in MosaicML Composer: between ``sb_start`` and ``sb_end`` of training, on all
  but every ``sb_interrupt``-th batch, rank the batch by a no-grad forward pass on a copy downsampled by
  ``sb_scale`` and backpropagate only the ``sb_keep`` fraction with the highest loss.
- ``budget`` (1): ``baseline`` only: train for this fraction of the baseline's steps (``epochs x
  batches per epoch``, rounded), with the learning-rate schedule ending at the run's own end; the
  last epoch is cut short when the steps do not fill it. ``--budgets`` adds these rows; they draw
  the frontier every other row is compared with at equal time (:mod:`~leanbatch.bench.frontier`).
- ``stack_scores`` (``selection``): for ``infobatch+sb``, which losses InfoBatch stores on a selected
  batch: ``selection`` stores the selection pass's loss of every example of the batch; ``trained``
  stores only the full-resolution training losses of the selected examples (the others keep their
  previous score).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["METHODS", "MAX_BUDGET", "MethodSpec", "MethodError", "parse_methods", "budget_label"]

METHODS = ("baseline", "random", "infobatch", "sb", "infobatch+sb")
_PRUNING = ("random", "infobatch", "infobatch+sb")
_SELECTING = ("sb", "infobatch+sb")
MAX_BUDGET = 4.0  # a budget above 1 trains longer than the baseline (a frontier reaching slower methods)


class MethodError(ValueError):
    """A method list could not be parsed; the message is one line."""


@dataclass(frozen=True)
class MethodSpec:
    """One row of the comparison: a method and its hyperparameters."""

    label: str
    kind: str
    prune_ratio: float = 0.5
    delta: float = 0.875
    sb_keep: float = 0.5
    sb_start: float = 0.5
    sb_end: float = 0.9
    sb_scale: float = 0.5
    sb_interrupt: int = 2
    stack_scores: str = "selection"
    budget: float = 1.0

    @property
    def prunes(self) -> bool:
        """Epoch-level pruning (an :class:`~leanbatch.InfoBatch` wrapper) is part of this method."""
        return self.kind in _PRUNING

    @property
    def selects(self) -> bool:
        """Batch-level selection (Selective Backprop) is part of this method."""
        return self.kind in _SELECTING

    @property
    def policy(self) -> str:
        return "random" if self.kind == "random" else "infobatch"

    def hyperparameters(self) -> dict[str, Any]:
        """The hyperparameters this method actually uses."""
        d = asdict(self)
        keep: list[str] = []
        if self.kind == "baseline":
            keep.append("budget")
        if self.prunes:
            keep += ["prune_ratio", "delta"]
        if self.selects:
            keep += ["sb_keep", "sb_start", "sb_end", "sb_scale", "sb_interrupt"]
        if self.kind == "infobatch+sb":
            keep.append("stack_scores")
        return {k: d[k] for k in keep}

    def validate(self) -> None:
        """Raise :class:`MethodError` for hyperparameters out of range."""
        if not 0.0 <= self.prune_ratio < 1.0:
            raise MethodError(f"{self.label}: prune_ratio must be in [0, 1), got {self.prune_ratio}")
        if not 0.0 < self.delta <= 1.0:
            raise MethodError(f"{self.label}: delta must be in (0, 1], got {self.delta}")
        if not 0.0 < self.sb_keep <= 1.0:
            raise MethodError(f"{self.label}: sb_keep must be in (0, 1], got {self.sb_keep}")
        if not 0.0 <= self.sb_start < self.sb_end <= 1.0:
            raise MethodError(
                f"{self.label}: need 0 <= sb_start < sb_end <= 1, got {self.sb_start}, {self.sb_end}"
            )
        if not 0.0 < self.sb_scale <= 1.0:
            raise MethodError(f"{self.label}: sb_scale must be in (0, 1], got {self.sb_scale}")
        if self.sb_interrupt < 0:
            raise MethodError(f"{self.label}: sb_interrupt must be >= 0, got {self.sb_interrupt}")
        if not 0.0 < self.budget <= MAX_BUDGET:
            raise MethodError(f"{self.label}: budget must be in (0, {MAX_BUDGET:g}], got {self.budget}")
        if self.budget != 1.0 and self.kind != "baseline":
            raise MethodError(f"{self.label}: budget applies to baseline only (the frontier's runs)")
        if self.stack_scores not in ("selection", "trained"):
            raise MethodError(
                f"{self.label}: stack_scores must be 'selection' or 'trained', got {self.stack_scores!r}"
            )


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise MethodError(f"unbalanced ']' in methods {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise MethodError(f"unbalanced '[' in methods {text!r}")
    items.append("".join(cur).strip())
    return [i for i in items if i]


_FIELD_TYPES = {f.name: f.type for f in fields(MethodSpec) if f.name not in ("label", "kind")}


def parse_methods(text: str, defaults: dict[str, Any] | None = None) -> list[MethodSpec]:
    """Parse ``--methods``; ``defaults`` are hyperparameters given by the global options.

    Example:
        >>> [m.label for m in parse_methods("baseline,infobatch+sb[sb_keep=0.7]")]
        ['baseline', 'infobatch+sb[sb_keep=0.7]']
    """
    specs: list[MethodSpec] = []
    items = _split_top(text)
    if not items:
        raise MethodError(f"no methods given; choose from {', '.join(METHODS)}")
    for item in items:
        name, _, rest = item.partition("[")
        name = name.strip()
        if name not in METHODS:
            raise MethodError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
        spec = replace(MethodSpec(label=name, kind=name), **(defaults or {}))
        if rest:
            if not rest.endswith("]"):
                raise MethodError(f"method {item!r}: overrides must be written name[key=value,...]")
            overrides: dict[str, Any] = {}
            for kv in rest[:-1].split(","):
                if not kv.strip():
                    continue
                key, eq, value = kv.partition("=")
                key = key.strip()
                if not eq or key not in _FIELD_TYPES:
                    raise MethodError(
                        f"method {item!r}: unknown setting {kv.strip()!r}; settings: {', '.join(_FIELD_TYPES)}"
                    )
                overrides[key] = _convert(key, value.strip(), item)
            spec = replace(spec, label=item.replace(" ", ""), **overrides)
        spec.validate()
        specs.append(spec)
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise MethodError(f"method(s) listed twice: {', '.join(dup)}")
    return specs


def budget_label(budget: float) -> str:
    """The row label of the baseline trained for ``budget`` of its steps (the plain baseline at 1).

    Example:
        >>> budget_label(0.5), budget_label(1.0)
        ('baseline[budget=0.5]', 'baseline')
    """
    return "baseline" if budget == 1.0 else f"baseline[budget={budget:g}]"


def _convert(key: str, value: str, item: str) -> Any:
    kind = _FIELD_TYPES[key]
    try:
        if kind in ("int", int):
            return int(value)
        if kind in ("float", float):
            return float(value)
    except ValueError as e:
        raise MethodError(f"method {item!r}: {key} must be a number, got {value!r}") from e
    return value
