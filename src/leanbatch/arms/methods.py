"""The arms of a study, and how ``--methods``, ``--budgets`` and ``--batch-budgets`` write them.

An *arm* is one way of training the task: a method kind (:data:`~leanbatch.arms.registry.REGISTRY`)
with its settings, trained once per seed. ``--methods`` takes a comma-separated list; each item is
a kind, optionally followed by settings in brackets, which makes it an arm of its own, labelled
as typed::

    baseline,random,infobatch,sb,infobatch+sb
    baseline,infobatch,infobatch+sb[start=0.2,keep=0.7]

The baseline's step budgets (``baseline[budget=b]``: ``round(b x`` the full run's steps``)``) and
batch budgets (``baseline[batch=b]``: the full run's steps on batches of ``round(b x B)`` rows)
draw the envelope every other arm is compared with (:mod:`~leanbatch.engine.judging.envelope`). An arm is
validated by building its library objects, so a bad value is the library's one-line error,
prefixed with the arm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leanbatch.arms.registry import MAX_BUDGET, REGISTRY, MethodKind, SelectorContext, Setting
from leanbatch.policies import Policy
from leanbatch.selection import Selector
from leanbatch.selection.tokens import TokenSelection

__all__ = [
    "DEFAULT_BATCH_BUDGETS",
    "DEFAULT_BUDGETS",
    "DEFAULT_METHODS",
    "OPTIONS",
    "Arm",
    "ArmError",
    "option_setting",
    "parse_budgets",
    "parse_methods",
    "make_arm",
    "with_budgets",
]

DEFAULT_METHODS = tuple(k.name for k in REGISTRY.values() if k.default_run)
DEFAULT_BUDGETS = "0.5,0.7,0.85,1"
DEFAULT_BATCH_BUDGETS = "0.5,0.7"
# the global options (--prune-ratio, --delta, --sb-*, --stack-scores): each sets its setting in every arm that has it
OPTIONS = tuple(dict.fromkeys(s.option for k in REGISTRY.values() for s in k.settings if s.option))


class ArmError(ValueError):
    """A method list could not be parsed or an arm's settings are invalid; the message is one line."""


@dataclass(frozen=True)
class Arm:
    """One arm of the study: a label, a registered kind and its settings (the library's names).

    ``control``: the label of this arm's uniform twin (``--controls``), or None.

    Example:
        >>> arm = parse_methods("obs[keep=0.7]")[0]
        >>> arm.label, arm.kind, arm.settings["keep"], arm.selects, arm.budget
        ('obs[keep=0.7]', 'obs', 0.7, True, 1.0)
    """

    label: str
    kind: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    control: str | None = None

    @property
    def method(self) -> MethodKind:
        """The registry entry of this arm's kind."""
        return REGISTRY[self.kind]

    @property
    def prunes(self) -> bool:
        """Epoch-level pruning is part of this arm (an :class:`~leanbatch.InfoBatch` with its policy)."""
        return self.method.policy is not None

    @property
    def selects(self) -> bool:
        """Batch-level selection is part of this arm (a selector called on every batch)."""
        return self.method.selector is not None

    @property
    def selects_tokens(self) -> bool:
        """Token-level selection is part of this arm (``run.token_loss``)."""
        return self.method.tokens is not None

    @property
    def budget(self) -> float:
        """The share of the full run's steps this arm trains (1 but for the step-budget baselines)."""
        return float(self.settings.get("budget", 1.0))

    @property
    def batch(self) -> float:
        """The share of the batch size this arm trains with (1 but for the batch-budget baselines)."""
        return float(self.settings.get("batch", 1.0))

    @property
    def limited(self) -> bool:
        """This arm trains a fixed number of steps (a step or batch budget), not the task's epochs."""
        return self.budget != 1.0 or self.batch != 1.0

    def policy(self, num_epochs: int, seed: int) -> Policy:
        """This arm's pruning policy (``prunes`` only), for ``InfoBatch(policy=...)``."""
        if self.method.policy is None:
            raise ValueError(f"{self.kind} does not prune")
        return self.method.policy(self.settings, num_epochs, seed)

    def selector(self, context: SelectorContext) -> Selector:
        """This arm's selector (``selects`` only)."""
        if self.method.selector is None:
            raise ValueError(f"{self.kind} does not select")
        return self.method.selector(self.settings, context)

    def token_selection(self, seed: int) -> TokenSelection:
        """This arm's token selection (``selects_tokens`` only), seeded for the run.

        Example:
            >>> parse_methods("token-selection[keep=0.7]")[0].token_selection(0)
            TokenSelection(keep=0.7, start=0.0, end=1.0, policy='excess', seed=0)
        """
        if self.method.tokens is None:
            raise ValueError(f"{self.kind} does not select tokens")
        return self.method.tokens(self.settings, seed)

    def probe_selector(self) -> Selector:
        """This arm's selector built for checks: seed 0, a one-sample memory, zero irreducible losses,
        a one-parameter proxy.
        """
        import torch

        def proxy(width: float) -> Any:
            model = torch.nn.Linear(1, 1, bias=False)
            return model, torch.optim.SGD(model.parameters(), lr=0.1)

        return self.selector(SelectorContext(0, 1, proxy, lambda: torch.zeros(1)))

    def config(self) -> dict[str, Any]:
        """The arm's entry in ``config.methods`` of results.json.

        Example:
            >>> parse_methods("rs2")[0].config()
            {'label': 'rs2', 'kind': 'rs2', 'settings': {'prune_ratio': 0.3}, 'budget': 1.0, 'batch': 1.0, 'control': None}
        """
        return {
            "label": self.label,
            "kind": self.kind,
            "settings": dict(self.settings),
            "budget": self.budget,
            "batch": self.batch,
            "control": self.control,
        }

    def validate(self) -> None:
        """Build this arm's library objects; :class:`ArmError` naming the arm if they refuse."""
        try:
            self.method.check(self.settings)
            if self.prunes:
                self.policy(8, seed=0)
            if self.selects:
                self.probe_selector()
            if self.selects_tokens:
                self.token_selection(0)
        except (TypeError, ValueError) as e:
            raise ArmError(f"{self.label}: {e}") from None


# ---------------------------------------------------------------------------- parsing
def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items, cur, depth = [], "", 0
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise ArmError(f"unbalanced ']' in methods {text!r}")
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if depth:
        raise ArmError(f"unbalanced '[' in methods {text!r}")
    return [i for i in [*items, cur.strip()] if i]


def _convert(setting: Setting, key: str, value: str, item: str) -> Any:
    """The bracket text ``value`` of ``setting`` as a Python value; finite numbers only."""
    if setting.type == "choice":
        return value
    if setting.type == "optional" and value.lower() in ("none", "off"):
        return None
    try:
        number: float = int(value) if setting.type == "int" else float(value)
    except ValueError:
        kind = "an integer" if setting.type == "int" else "a number"
        raise ArmError(f"method {item!r}: {key} must be {kind}, got {value!r}") from None
    if not math.isfinite(number):
        raise ArmError(f"method {item!r}: {setting.name} must be a finite number, got {number!r}")
    return number


def _overrides(method: MethodKind, rest: str, item: str) -> dict[str, Any]:
    """The settings written in an item's brackets (``rest`` is what follows ``[``)."""
    if not rest.endswith("]"):
        raise ArmError(f"method {item!r}: settings must be written name[key=value,...]")
    out: dict[str, Any] = {}
    for kv in rest[:-1].split(","):
        if not kv.strip():
            continue
        key, eq, value = (part.strip() for part in kv.partition("="))
        setting = method.setting(key)
        if not eq:
            raise ArmError(f"method {item!r}: write {key}=value")
        if setting is None:
            owners = [k.name for k in REGISTRY.values() if k.setting(key) is not None]
            where = f"{key} applies to {', '.join(owners)} only" if owners else f"unknown setting {key!r}"
            own = ", ".join(s.describe() for s in method.settings)
            raise ArmError(f"method {item!r}: {where}; {method.name}'s settings: {own}")
        if key in out:
            raise ArmError(f"method {item!r}: {key} is set twice")
        out[key] = _convert(setting, key, value, item)
    return out


def make_arm(
    kind: str, label: str | None = None, options: Mapping[str, Any] | None = None, **settings: Any
) -> Arm:
    """An arm of ``kind``: the registry's defaults, then the global ``options`` (keyed as
    :data:`OPTIONS`), then ``settings``; not validated.
    """
    method = REGISTRY[kind]
    values = method.defaults()
    for s in method.settings:
        if options and s.option is not None and options.get(s.option) is not None:
            values[s.name] = options[s.option]
    unknown = set(settings) - set(values)
    if unknown:
        raise ArmError(f"{kind} has no setting {', '.join(sorted(unknown))}")
    return Arm(label or kind, kind, {**values, **settings})


def parse_methods(text: str, options: Mapping[str, Any] | None = None) -> list[Arm]:
    """Parse ``--methods`` into validated arms; ``options``: the global options' values (:data:`OPTIONS`).

    Example:
        >>> [a.label for a in parse_methods("baseline,infobatch+sb[keep=0.7]")]
        ['baseline', 'infobatch+sb[keep=0.7]']
    """
    items = _split_top(text)
    if not items:
        raise ArmError(f"no methods given; choose from {', '.join(REGISTRY)}")
    arms: list[Arm] = []
    for item in items:
        name, bracket, rest = item.partition("[")
        name = name.strip()
        if name not in REGISTRY:
            raise ArmError(f"unknown method {name!r}; choose from {', '.join(REGISTRY)}")
        overrides = _overrides(REGISTRY[name], rest, item) if bracket else {}
        arm = make_arm(name, item.replace(" ", "") if bracket else name, options, **overrides)
        arm.validate()
        arms.append(arm)
    labels = [a.label for a in arms]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ArmError(f"method(s) listed twice: {', '.join(dup)}")
    return arms


def option_setting(option: str) -> tuple[str, list[str], Any]:
    """What a global option (one of :data:`OPTIONS`) sets: the setting's name, the kinds that have it,
    its default.

    Example:
        >>> option_setting("sb_keep")
        ('keep', ['sb', 'infobatch+sb', 'infobatch+uniform'], 0.5)
    """
    found = [(k.name, s) for k in REGISTRY.values() for s in k.settings if s.option == option]
    if not found:
        raise KeyError(f"no setting is set by --{option.replace('_', '-')}")
    return found[0][1].name, [kind for kind, _ in found], found[0][1].default


# ---------------------------------------------------------------------------- budgets
def parse_budgets(text: str, option: str = "--budgets") -> list[float]:
    """``--budgets`` (shares of the full run's steps) or ``--batch-budgets`` (of its batch size):
    comma-separated, or ``none``; sorted.
    """
    if text.strip().lower() in ("none", ""):
        return []
    of, example = (
        ("steps", DEFAULT_BUDGETS) if option == "--budgets" else ("batch size", DEFAULT_BATCH_BUDGETS)
    )
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ArmError(
            f"{option} must be comma-separated fractions of the baseline's {of}, e.g. {example}, or none; got {text!r}"
        ) from None
    if not values or any(not (0.0 < v <= MAX_BUDGET) or not math.isfinite(v) for v in values):
        raise ArmError(f"{option} must be fractions in (0, {MAX_BUDGET:g}], e.g. {example}; got {text!r}")
    if len(set(values)) != len(values):
        raise ArmError(f"{option} lists a budget twice: {text}")
    return sorted(values)


def with_budgets(arms: list[Arm], budgets: Sequence[float], batch_budgets: Sequence[float] = ()) -> list[Arm]:
    """``arms`` with a baseline arm for every step and batch budget not already among them: the full
    baseline, the step budgets (ascending), the batch budgets (ascending), then the other arms.
    """
    have = {(a.budget, a.batch) for a in arms if a.kind == "baseline"}
    grid = [("budget", b) for b in budgets] + [("batch", b) for b in batch_budgets]
    extra = [
        make_arm("baseline", "baseline" if b == 1.0 else f"baseline[{k}={b:g}]", None, **{k: b})
        for k, b in grid
    ]
    base = [a for a in arms if a.kind == "baseline"] + [a for a in extra if (a.budget, a.batch) not in have]
    base.sort(key=lambda a: (a.budget != 1.0 or a.batch != 1.0, a.batch != 1.0, a.budget, a.batch))
    return base + [a for a in arms if a.kind != "baseline"]
