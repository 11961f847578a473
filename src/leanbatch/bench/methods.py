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

Methods beyond the default five (``--methods`` lists them by name; each paper's defaults):

- ``infobatch`` / ``random`` options for short schedules (each off by default): ``ib_target``
  (``below``: ``prune_ratio`` is a share of the below-mean samples, the paper; ``all``: a share of all
  samples, drawn from the below-mean ones), ``ib_warmup`` (0: epochs that train on all data first; epoch 0 always does, so 2 is
  the first value that changes anything),
  ``ib_refresh`` (0: every n-th epoch trains on all data), ``ib_max_weight`` (0: the exact
  rescaling; else its cap, e.g. 1 = no rescaling).
- ``rs2``: repeated random sampling without replacement (Okanovic et al., 2023): ``prune_fraction``
  (0.3) of the data left out of every epoch, cycling through the data.
- ``epsilon-greedy``, ``ucb``: dynamic pruning by a bandit rule (Raju et al., 2021): ``prune_fraction``
  (0.3), ``epsilon`` (0.1) random share of the budget, ``score_ema`` (0.9) momentum of the loss EMA,
  ``ucb_c`` (1.0) weight of its standard deviation.
- ``seta``: SeTa (Zhou et al., CVPR 2025): ``seta_prune`` (0.1) random pruning, ``seta_groups`` (5)
  loss groups, ``seta_window`` (0.9) share of the groups in the sliding window, ``delta`` annealing.
- ``obs``: online batch selection by loss rank (Loshchilov & Hutter, 2015), no extra forward pass:
  ``sel_keep`` (0.5) of each batch, ``obs_pressure`` (100) selection pressure, ``obs_final_pressure``
  (0: constant) to decay it to.
- ``sb-proxy``: the hardest ``sel_keep`` (0.5) of each batch by a proxy model ``proxy_width`` (0.25)
  times the width, trained alongside (the airbench runs) on its own hardest ``proxy_keep`` (0.5) of
  every ``proxy_every``-th (1) batch.
- ``sel_start`` (0), ``sel_end`` (1), ``sel_interrupt`` (0): the window of ``obs`` and ``sb-proxy``
  (their papers select on every batch).
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


NEW_METHODS = ("rs2", "epsilon-greedy", "ucb", "seta", "obs", "sb-proxy")  # not in the default run
KINDS = METHODS + NEW_METHODS  # every method --methods accepts
_NEW_PRUNING = ("rs2", "epsilon-greedy", "ucb", "seta")
_NEW_SELECTING = ("obs", "sb-proxy")
__all__ += ["KINDS", "NEW_METHODS"]


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
    ib_target: str = "below"
    ib_warmup: int = 0
    ib_refresh: int = 0
    ib_max_weight: float = 0.0
    prune_fraction: float = 0.3
    epsilon: float = 0.1
    score_ema: float = 0.9
    ucb_c: float = 1.0
    seta_prune: float = 0.1
    seta_groups: int = 5
    seta_window: float = 0.9
    sel_keep: float = 0.5
    sel_start: float = 0.0
    sel_end: float = 1.0
    sel_interrupt: int = 0
    obs_pressure: float = 100.0
    obs_final_pressure: float = 0.0
    proxy_width: float = 0.25
    proxy_keep: float = 0.5
    proxy_every: int = 1
    stack_scores: str = "selection"
    budget: float = 1.0

    @property
    def prunes(self) -> bool:
        """Epoch-level pruning (an :class:`~leanbatch.InfoBatch` wrapper) is part of this method."""
        return self.kind in _PRUNING or self.kind in _NEW_PRUNING

    @property
    def selects(self) -> bool:
        """Batch-level selection (Selective Backprop) is part of this method."""
        return self.kind in _SELECTING or self.kind in _NEW_SELECTING

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
        if self.kind in _NEW_HYPERPARAMETERS:  # their own budget fields, not InfoBatch's
            keep = [k for k in keep if k not in ("prune_ratio", "delta")] + list(
                _NEW_HYPERPARAMETERS[self.kind]
            )
        if self.kind in ("random", "infobatch", "infobatch+sb"):
            keep += ["ib_target", "ib_warmup", "ib_refresh", "ib_max_weight"]
        return {k: d[k] for k in keep}

    def make_policy(self, num_epochs: int, seed: int) -> Any:
        """The pruning policy of this row (``prunes`` only), for ``InfoBatch(policy=...)``.

        Example:
            >>> MethodSpec("rs2", "rs2").make_policy(8, seed=0)
            RS2Policy(prune_ratio=0.3, num_epochs=8, delta=1.0, seed=0)
        """
        from leanbatch.policies import (
            EpsilonGreedyPolicy,
            InfoBatchPolicy,
            RandomPolicy,
            RS2Policy,
            SeTaPolicy,
            UCBPolicy,
        )

        if self.kind == "rs2":
            return RS2Policy(self.prune_fraction, num_epochs, seed=seed)
        if self.kind == "epsilon-greedy":
            return EpsilonGreedyPolicy(
                self.prune_fraction, num_epochs, epsilon=self.epsilon, ema=self.score_ema
            )
        if self.kind == "ucb":
            return UCBPolicy(
                self.prune_fraction, num_epochs, epsilon=self.epsilon, ema=self.score_ema, c=self.ucb_c
            )
        if self.kind == "seta":
            return SeTaPolicy(self.seta_prune, num_epochs, self.seta_groups, self.seta_window, self.delta)
        cls = RandomPolicy if self.kind == "random" else InfoBatchPolicy
        return cls(
            self.prune_ratio,
            num_epochs,
            self.delta,
            target=self.ib_target,
            warmup_epochs=self.ib_warmup,
            refresh_every=self.ib_refresh,
            max_weight=self.ib_max_weight or None,
        )

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
        self._validate_new()

    def _validate_new(self) -> None:
        """The hyperparameters of the methods beyond the default five, through the library's own checks."""
        bad = [
            f"{name}={getattr(self, name)}" for name, ok in _NEW_RANGES.items() if not ok(getattr(self, name))
        ]
        if self.ib_target not in ("below", "all"):
            bad.append(f"ib_target={self.ib_target!r} (below or all)")
        if not self.sel_start < self.sel_end:
            bad.append(f"sel_start={self.sel_start} >= sel_end={self.sel_end}")
        if bad:
            raise MethodError(f"{self.label}: out of range: {', '.join(bad)}; see leanbatch.bench.methods")
        if self.prunes:
            try:
                self.make_policy(8, seed=0)
            except ValueError as e:
                raise MethodError(f"{self.label}: {e}") from None


_NEW_HYPERPARAMETERS: dict[str, tuple[str, ...]] = {
    "rs2": ("prune_fraction",),
    "epsilon-greedy": ("prune_fraction", "epsilon", "score_ema"),
    "ucb": ("prune_fraction", "epsilon", "score_ema", "ucb_c"),
    "seta": ("seta_prune", "seta_groups", "seta_window", "delta"),
    "obs": ("sel_keep", "sel_start", "sel_end", "sel_interrupt", "obs_pressure", "obs_final_pressure"),
    "sb-proxy": (
        "sel_keep",
        "sel_start",
        "sel_end",
        "sel_interrupt",
        "proxy_width",
        "proxy_keep",
        "proxy_every",
    ),
}
_NEW_RANGES = {
    "ib_warmup": lambda v: v >= 0,
    "ib_refresh": lambda v: v >= 0,
    "ib_max_weight": lambda v: v == 0 or v >= 1,
    "prune_fraction": lambda v: 0 <= v < 1,
    "epsilon": lambda v: 0 <= v <= 1,
    "score_ema": lambda v: 0 <= v < 1,
    "ucb_c": lambda v: v >= 0,
    "seta_prune": lambda v: 0 <= v < 1,
    "seta_groups": lambda v: v >= 1,
    "seta_window": lambda v: 0 < v <= 1,
    "sel_keep": lambda v: 0 < v <= 1,
    "sel_start": lambda v: 0 <= v < 1,
    "sel_end": lambda v: 0 < v <= 1,
    "sel_interrupt": lambda v: v >= 0,
    "obs_pressure": lambda v: v >= 1,
    "obs_final_pressure": lambda v: v == 0 or v >= 1,
    "proxy_width": lambda v: 0 < v <= 1,
    "proxy_keep": lambda v: 0 < v <= 1,
    "proxy_every": lambda v: v >= 1,
}


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
        raise MethodError(f"no methods given; choose from {', '.join(KINDS)}")
    for item in items:
        name, _, rest = item.partition("[")
        name = name.strip()
        if name not in KINDS:
            raise MethodError(f"unknown method {name!r}; choose from {', '.join(KINDS)}")
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
