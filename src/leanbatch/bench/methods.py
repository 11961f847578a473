"""The rows of a comparison, and how ``--methods`` writes them.

``--methods`` takes a comma-separated list. Each item is a method kind (:data:`REGISTRY`), optionally
followed by settings in brackets, which also makes it a row of its own, labelled as typed::

    baseline,random,infobatch,sb,infobatch+sb
    baseline,infobatch,infobatch+sb[start=0.2,keep=0.7]
    infobatch+sb[sb_start=0.2,sb_keep=0.7]          # the same settings, in the old spelling

Settings are named as the library names them (``InfoBatchPolicy(prune_ratio=, delta=, target=,
warmup_epochs=, refresh_every=, max_weight=)``, ``SelectiveBackprop(keep=, start=, end=,
scale_factor=, interrupt=)``, ``OnlineBatchSelection(pressure=, final_pressure=)``...); the
spellings of earlier versions (``sb_keep``, ``prune_fraction``, ``ib_warmup``...) are aliases.
``leanbatch bench --help`` lists every kind and setting. A row is validated by building its
library objects, so a bad value is the library's one-line error, prefixed with the row.
NaN and infinity are refused in brackets, whatever the setting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from leanbatch.bench.registry import MAX_BUDGET, REGISTRY, MethodKind, SelectorContext, Setting
from leanbatch.checks import check_real
from leanbatch.policies import Policy
from leanbatch.selection import Selector

__all__ = [
    "DEFAULT_METHODS",
    "GLOBAL_SETTINGS",
    "KINDS",
    "MAX_BUDGET",
    "MethodError",
    "MethodRow",
    "budget_label",
    "global_setting",
    "make_row",
    "parse_methods",
]

KINDS = tuple(REGISTRY)  # every kind --methods accepts
DEFAULT_METHODS = tuple(k.name for k in REGISTRY.values() if k.default_run)  # what --methods defaults to
# The global options (--prune-ratio, --delta, --sb-*, --stack-scores), by the key each sets: a row
# whose setting carries that key in results.json takes the option's value (brackets still win).
GLOBAL_SETTINGS = (
    "prune_ratio",
    "delta",
    "sb_keep",
    "sb_start",
    "sb_end",
    "sb_scale",
    "sb_interrupt",
    "stack_scores",
)


class MethodError(ValueError):
    """A method list could not be parsed or a row's settings are invalid; the message is one line.

    Example:
        >>> try:
        ...     parse_methods("sb[sb_keep=2]")
        ... except MethodError as e:
        ...     print(e)
        sb[sb_keep=2]: keep must be in (0, 1], got 2.0 (sb_keep is keep)
    """


@dataclass(frozen=True)
class MethodRow:
    """One row of the comparison: a label, a registered kind and its settings (library names).

    Example:
        >>> row = parse_methods("obs[sel_keep=0.7]")[0]
        >>> row.label, row.kind, row.settings["keep"], row.selects
        ('obs[sel_keep=0.7]', 'obs', 0.7, True)
        >>> row.config()["sel_keep"], row.config()["settings"]["keep"]
        (0.7, 0.7)
    """

    label: str
    kind: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    recorded: Mapping[str, Any] = field(default_factory=dict)  # see MethodKind.recorded
    control: str | None = None  # the label of this row's uniform twin's row (--controls)

    @property
    def method(self) -> MethodKind:
        """The registry entry of this row's kind."""
        return REGISTRY[self.kind]

    @property
    def prunes(self) -> bool:
        """Epoch-level pruning is part of this method."""
        return self.method.prunes

    @property
    def selects(self) -> bool:
        """Batch-level selection is part of this method."""
        return self.method.selects

    @property
    def selection_scale(self) -> float:
        """The scale a selection pass is charged at in the work (a pass costs ``scale ** 2`` of a forward):
        ``scale_factor`` of a downsampled selection pass; a row scored otherwise (the proxy) is charged
        at the ``--sb-scale`` its results.json entry records, as in earlier versions.

        Example:
            >>> parse_methods("sb[scale_factor=0.25]")[0].selection_scale, parse_methods("sb-proxy")[0].selection_scale
            (0.25, 0.5)
        """
        return float(self.settings.get("scale_factor", self.recorded.get("sb_scale", 1.0)))

    @property
    def budget(self) -> float:
        """The share of the baseline's steps this row trains for (1 but for the frontier's baselines)."""
        return float(self.settings.get("budget", 1.0))

    @property
    def batch(self) -> float:
        """The share of the batch size this row trains with (1 but for the batch-budget baselines)."""
        return float(self.settings.get("batch", 1.0))

    def make_policy(self, num_epochs: int, seed: int) -> Policy:
        """The pruning policy of this row (``prunes`` only), for ``InfoBatch(policy=...)``.

        Example:
            >>> parse_methods("rs2")[0].make_policy(8, seed=0)
            RS2Policy(prune_ratio=0.3, num_epochs=8, delta=1.0, seed=0)
        """
        return self.method.build_policy(self.settings, num_epochs, seed)

    def make_selector(self, context: SelectorContext) -> Selector:
        """The selector of this row (``selects`` only); see :class:`~leanbatch.bench.registry.SelectorContext`."""
        return self.method.build_selector(self.settings, context)

    def probe_selector(self) -> Selector:
        """This row's selector built for checks: seed 0, a one-sample memory, a one-parameter proxy, zero
        irreducible losses (no holdout model trained).

        Example:
            >>> parse_methods("sb")[0].probe_selector().keep
            0.5
        """
        return self.make_selector(SelectorContext(0, 1, _probe_proxy, lambda settings: torch.zeros(1)))

    def config(self) -> dict[str, Any]:
        """The row's entry in ``config.methods``: label, kind, each setting under its key in earlier
        versions (:attr:`Setting.key`) and ``settings``, by the library's names.

        Example:
            >>> parse_methods("rs2")[0].config()
            {'label': 'rs2', 'kind': 'rs2', 'prune_fraction': 0.3, 'settings': {'prune_ratio': 0.3}}
        """
        legacy = {s.key: s.legacy_value(self.settings[s.name]) for s in self.method.settings}
        control = {} if self.control is None else {"control": self.control}
        return {
            "label": self.label,
            "kind": self.kind,
            **self.recorded,
            **legacy,
            "settings": dict(self.settings),
            **control,
        }

    def validate(self, num_epochs: int = 8) -> None:
        """Build this row's library objects; :class:`MethodError` naming the row if they refuse."""
        try:
            self.method.check(self.settings)
            if self.prunes:
                self.make_policy(num_epochs, seed=0)
            if self.selects:
                self.probe_selector()
        except (TypeError, ValueError) as e:
            raise MethodError(f"{self.label}: {e}{_alias_note(self)}") from None


def _probe_proxy(width: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A stand-in proxy (one zero parameter, no random draw) for checking settings."""
    model = nn.Module()
    model.weight = nn.Parameter(torch.zeros(1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _alias_note(row: MethodRow) -> str:
    """`` (sb_keep is keep)`` for every old spelling in the row's label."""
    typed = _typed_keys(row.label)
    pairs = [f"{k} is {s.name}" for k in typed if (s := row.method.setting(k)) is not None and k != s.name]
    return f" ({', '.join(pairs)})" if pairs else ""


def _typed_keys(label: str) -> list[str]:
    _, _, rest = label.partition("[")
    return [kv.partition("=")[0].strip() for kv in rest.rstrip("]").split(",") if "=" in kv]


# ---------------------------------------------------------------------------- parsing
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


def _convert(setting: Setting, key: str, value: str, item: str) -> Any:
    """The bracket text ``value`` of ``setting`` (typed as ``key``) as a Python value; finite numbers only."""
    if setting.type == "choice":
        return value
    if setting.type == "optional" and value.lower() in ("none", "off"):
        return None
    try:
        number: float = int(value) if setting.type == "int" else float(value)
    except ValueError:
        kind = "an integer" if setting.type == "int" else "a number"
        raise MethodError(f"method {item!r}: {key} must be {kind}, got {value!r}") from None
    if not math.isfinite(number):
        try:
            check_real(number, setting.name)
        except ValueError as e:
            raise MethodError(f"method {item!r}: {e}") from None
    if setting.type == "optional" and number == 0:
        return None  # 0: the option off, as earlier versions wrote it
    return number


def _unknown(method: MethodKind, key: str, item: str) -> MethodError:
    """The error for a setting ``method`` does not have: which kinds have it, and its own settings."""
    owners = [k.name for k in REGISTRY.values() if k.setting(key) is not None]
    own = ", ".join(s.describe() for s in method.settings)
    if owners:
        return MethodError(
            f"method {item!r}: {key} applies to {', '.join(owners)} only; {method.name}'s settings: {own}"
        )
    return MethodError(f"method {item!r}: unknown setting {key!r}; {method.name}'s settings: {own}")


def _overrides(method: MethodKind, rest: str, item: str) -> dict[str, Any]:
    """The settings written in an item's brackets (``rest`` is what follows ``[``), by library name."""
    if not rest.endswith("]"):
        raise MethodError(f"method {item!r}: overrides must be written name[key=value,...]")
    out: dict[str, Any] = {}
    for kv in rest[:-1].split(","):
        if not kv.strip():
            continue
        key, eq, value = (part.strip() for part in kv.partition("="))
        setting = method.setting(key)
        if not eq or setting is None:
            raise _unknown(method, key, item) if eq else MethodError(f"method {item!r}: write {key}=value")
        if setting.name in out:
            raise MethodError(f"method {item!r}: {setting.name} is set twice ({key} is {setting.name})")
        out[setting.name] = _convert(setting, key, value, item)
    return out


def make_row(
    kind: str, label: str | None = None, defaults: Mapping[str, Any] | None = None, **settings: Any
) -> MethodRow:
    """A row of ``kind``: the registry's defaults, then the global ``defaults`` (by :attr:`Setting.key`),
    then ``settings`` (by library name); not validated.

    Example:
        >>> make_row("baseline", "baseline[budget=0.5]", budget=0.5).budget
        0.5
    """
    method = REGISTRY[kind]
    values = method.defaults()
    for s in method.settings:
        if defaults and s.key in defaults and s.shared:
            values[s.name] = defaults[s.key]
    unknown = set(settings) - set(values)
    if unknown:
        raise MethodError(f"{kind} has no setting {', '.join(sorted(unknown))}")
    given = defaults or {}
    recorded = {key: given[key] if key in given else global_setting(key)[2] for key in method.recorded}
    return MethodRow(label or kind, kind, {**values, **settings}, recorded)


def parse_methods(
    text: str, defaults: Mapping[str, Any] | None = None, num_epochs: int = 8
) -> list[MethodRow]:
    """Parse ``--methods`` into validated rows; ``defaults``: the global options' values, keyed as
    :data:`GLOBAL_SETTINGS`; ``num_epochs``: the run's, for building the pruning policies.

    Example:
        >>> [m.label for m in parse_methods("baseline,infobatch+sb[sb_keep=0.7]")]
        ['baseline', 'infobatch+sb[sb_keep=0.7]']
        >>> parse_methods("infobatch+sb[sb_keep=0.7]")[0].settings == parse_methods("infobatch+sb[keep=0.7]")[0].settings
        True
    """
    items = _split_top(text)
    if not items:
        raise MethodError(f"no methods given; choose from {', '.join(KINDS)}")
    rows: list[MethodRow] = []
    for item in items:
        name, bracket, rest = item.partition("[")
        name = name.strip()
        if name not in REGISTRY:
            raise MethodError(f"unknown method {name!r}; choose from {', '.join(KINDS)}")
        overrides = _overrides(REGISTRY[name], rest, item) if bracket else {}
        row = make_row(name, item.replace(" ", "") if bracket else name, defaults, **overrides)
        row.validate(num_epochs)
        rows.append(row)
    labels = [r.label for r in rows]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise MethodError(f"method(s) listed twice: {', '.join(dup)}")
    return rows


def budget_label(budget: float, batch: float = 1.0) -> str:
    """The row label of the baseline trained for ``budget`` of its steps or on batches of ``batch`` of
    the batch size (the plain baseline at 1).

    Example:
        >>> budget_label(0.5), budget_label(1.0), budget_label(1.0, batch=0.7)
        ('baseline[budget=0.5]', 'baseline', 'baseline[batch=0.7]')
    """
    if batch != 1.0:
        return f"baseline[batch={batch:g}]"
    return "baseline" if budget == 1.0 else f"baseline[budget={budget:g}]"


def global_setting(key: str) -> tuple[str, list[str], Any]:
    """What the global option of ``key`` (one of :data:`GLOBAL_SETTINGS`) sets: the library's name of
    the setting, the kinds that have it under that key, and its default.

    Example:
        >>> global_setting("sb_keep"), global_setting("delta")[1]
        (('keep', ['sb', 'infobatch+sb', 'infobatch+uniform'], 0.5), ['random', 'infobatch', 'infobatch+sb', 'seta', 'infobatch+uniform'])
    """
    found = [(k.name, s) for k in REGISTRY.values() for s in k.settings if s.key == key and s.shared]
    if not found:
        raise KeyError(f"no setting is written {key!r} in results.json")
    return found[0][1].name, [kind for kind, _ in found], found[0][1].default
