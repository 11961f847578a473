"""Every method the benchmark compares, registered once: what it does, its settings, how to build it.

A :class:`MethodKind` holds a method's name, its family (``baseline``, ``pruning``, ``selecting``
or ``both``), a one-line description, its settings *named as the library names them* with the
papers' defaults, and the functions that build the library objects from those settings: the
pruning policy (for :class:`~leanbatch.InfoBatch`) and the selector (a
:class:`~leanbatch.selection.Selector`). The bench validates a row by building them, so a bad
value fails with the library's own message (:mod:`leanbatch.checks`), naming its argument.

Each :class:`Setting` also lists its *aliases*: the bracket spellings of earlier versions
(``sb_keep``, ``prune_fraction``, ``ib_warmup``...). The first alias, or the name when there is
none, is the setting's key in ``config.methods`` of ``results.json`` (unchanged from before).
``twin`` names the kind that makes the same choice uniformly at random (InfoBatch's is
``random``); what the choosing buys is the difference between the two.

Example:
    >>> REGISTRY["rs2"].family, [s.name for s in REGISTRY["rs2"].settings]
    ('pruning', ['prune_ratio'])
    >>> REGISTRY["rs2"].build_policy({"prune_ratio": 0.3}, num_epochs=8, seed=0)
    RS2Policy(prune_ratio=0.3, num_epochs=8, delta=1.0, seed=0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from leanbatch.checks import check_choice, check_real
from leanbatch.policies import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    Policy,
    RandomPolicy,
    RS2Policy,
    SeTaPolicy,
    UCBPolicy,
)
from leanbatch.selection import OnlineBatchSelection, ProxyScorer, SelectiveBackprop, Selector

__all__ = [
    "FAMILIES",
    "MAX_BUDGET",
    "REGISTRY",
    "MethodKind",
    "ProxyFactory",
    "SelectorContext",
    "Setting",
]

FAMILIES = ("baseline", "pruning", "selecting", "both")
MAX_BUDGET = 4.0  # a budget above 1 trains longer than the baseline (a frontier reaching slower methods)

Settings = Mapping[str, Any]
ProxyFactory = Callable[[float], tuple[nn.Module, torch.optim.Optimizer]]  # width -> proxy, its optimiser


@dataclass(frozen=True)
class Setting:
    """One setting of a method: the library's name, the paper's default, the old bracket spellings.

    ``type`` reads the bracket text: ``"float"``, ``"int"``, ``"choice"`` (one of ``choices``) or
    ``"optional"`` (a float, or ``0``/``none`` for ``None``: the option off). ``check`` validates a
    bench-only setting (the library's objects check the others when they are built).

    Example:
        >>> s = Setting("max_weight", None, "optional", aliases=("ib_max_weight",))
        >>> s.key, s.legacy_value(None), s.describe()
        ('ib_max_weight', 0.0, 'max_weight=none (ib_max_weight)')
    """

    name: str
    default: Any
    type: str = "float"
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    check: Callable[[Any], Any] | None = None

    @property
    def key(self) -> str:
        """The setting's key in ``config.methods`` of results.json: its first old spelling, or its name."""
        return self.aliases[0] if self.aliases else self.name

    def legacy_value(self, value: Any) -> Any:
        """``value`` as earlier versions wrote it under :attr:`key` (an option off was 0)."""
        return 0.0 if self.type == "optional" and value is None else value

    def describe(self) -> str:
        """``name=default (aliases)``, for ``--help``."""
        default = (
            "none" if self.default is None else f"{self.default:g}" if self.type != "choice" else self.default
        )
        alias = f" ({', '.join(self.aliases)})" if self.aliases else ""
        return f"{self.name}={default}{alias}"


class SelectorContext(NamedTuple):
    """What building a selector needs besides its settings: the run's seed, the dataset's size (a
    memory of losses) and how to make a proxy model of a given width with its optimiser.

    Example:
        >>> import torch
        >>> def proxy(width):
        ...     model = torch.nn.Linear(2, 2)
        ...     return model, torch.optim.SGD(model.parameters(), lr=0.1)
        >>> ctx = SelectorContext(seed=0, num_samples=100, proxy=proxy)
        >>> REGISTRY["obs"].build_selector(REGISTRY["obs"].defaults(), ctx).keep
        0.5
    """

    seed: int
    num_samples: int
    proxy: ProxyFactory


@dataclass(frozen=True)
class MethodKind:
    """A registered method: see the module docstring.

    Example:
        >>> REGISTRY["infobatch+sb"].prunes, REGISTRY["infobatch+sb"].selects, REGISTRY["infobatch"].twin
        (True, True, 'random')
    """

    name: str
    family: str
    description: str
    settings: tuple[Setting, ...]
    policy: Callable[[Settings, int, int], Policy] | None = None  # (settings, num_epochs, seed)
    selector: Callable[[Settings, SelectorContext], Selector] | None = None
    twin: str | None = None  # the kind that makes the same choice uniformly at random
    default_run: bool = False  # one of the rows of a plain ``leanbatch bench``
    # Keys of global options that earlier versions also wrote into this kind's entry of
    # config.methods though it does not use them; still written, so old readers find them.
    recorded: tuple[str, ...] = ()

    @property
    def prunes(self) -> bool:
        """Epoch-level pruning (an :class:`~leanbatch.InfoBatch` wrapper with this kind's policy)."""
        return self.policy is not None

    @property
    def selects(self) -> bool:
        """Batch-level selection (a selector called on every batch)."""
        return self.selector is not None

    def setting(self, name: str) -> Setting | None:
        """The setting called ``name`` or spelled so by an alias (``None``: not one of this kind's)."""
        return next((s for s in self.settings if name == s.name or name in s.aliases), None)

    def defaults(self) -> dict[str, Any]:
        """Every setting at its default, by the library's names."""
        return {s.name: s.default for s in self.settings}

    def build_policy(self, settings: Settings, num_epochs: int, seed: int) -> Policy:
        """The pruning policy of ``settings`` for ``InfoBatch(policy=...)``."""
        if self.policy is None:
            raise ValueError(f"{self.name} does not prune")
        return self.policy(settings, num_epochs, seed)

    def build_selector(self, settings: Settings, context: SelectorContext) -> Selector:
        """The selector of ``settings``, called on every batch."""
        if self.selector is None:
            raise ValueError(f"{self.name} does not select")
        return self.selector(settings, context)

    def check(self, settings: Settings) -> None:
        """Run the bench-only settings' checks (the library checks the rest when its objects are built)."""
        for s in self.settings:
            if s.check is not None:
                s.check(settings[s.name])


# ---------------------------------------------------------------------------- builders
def _rescaled(cls: type[InfoBatchPolicy] | type[RandomPolicy]) -> Callable[[Settings, int, int], Policy]:
    """The builder of InfoBatch's policy (``InfoBatchPolicy``) or of its uniform twin (``RandomPolicy``)."""

    def build(s: Settings, num_epochs: int, seed: int) -> Policy:
        return cls(
            s["prune_ratio"],
            num_epochs,
            s["delta"],
            target=s["target"],
            warmup_epochs=s["warmup_epochs"],
            refresh_every=s["refresh_every"],
            max_weight=s["max_weight"],
        )

    return build


def _rs2(s: Settings, num_epochs: int, seed: int) -> Policy:
    return RS2Policy(s["prune_ratio"], num_epochs, seed=seed)


def _epsilon_greedy(s: Settings, num_epochs: int, seed: int) -> Policy:
    return EpsilonGreedyPolicy(s["prune_ratio"], num_epochs, epsilon=s["epsilon"], ema=s["ema"])


def _ucb(s: Settings, num_epochs: int, seed: int) -> Policy:
    return UCBPolicy(s["prune_ratio"], num_epochs, epsilon=s["epsilon"], ema=s["ema"], c=s["c"])


def _seta(s: Settings, num_epochs: int, seed: int) -> Policy:
    return SeTaPolicy(s["prune_ratio"], num_epochs, s["num_groups"], s["window_scale"], s["delta"])


def _window(s: Settings) -> dict[str, Any]:
    """The settings every selector shares: the share kept and the window (start, end, interrupt)."""
    return {name: s[name] for name in ("keep", "start", "end", "interrupt")}


def _selective_backprop(s: Settings, ctx: SelectorContext) -> Selector:
    return SelectiveBackprop(**_window(s), scale_factor=s["scale_factor"], seed=ctx.seed)


def _online_batch_selection(s: Settings, ctx: SelectorContext) -> Selector:
    return OnlineBatchSelection(
        ctx.num_samples,
        **_window(s),
        pressure=s["pressure"],
        final_pressure=s["final_pressure"],
        seed=ctx.seed,
    )


def _proxy(s: Settings, ctx: SelectorContext) -> Selector:
    model, optimizer = ctx.proxy(s["width"])
    scorer = ProxyScorer(
        model, optimizer, F.cross_entropy, train_every=s["train_every"], train_keep=s["train_keep"]
    )
    return SelectiveBackprop(**_window(s), rule="top", scorer=scorer, seed=ctx.seed)


# ---------------------------------------------------------------------------- settings
def _budget(v: Any) -> float:
    return check_real(v, "budget", 0.0, MAX_BUDGET, low_open=True, hint="a share of the baseline's steps")


def _width(v: Any) -> float:
    return check_real(v, "width", 0.0, 1.0, low_open=True, hint="the proxy's width, a share of the model's")


def _stack(v: Any) -> str:
    return check_choice(v, "stack_scores", ("selection", "trained"))


_INFOBATCH = (
    Setting("prune_ratio", 0.5),
    Setting("delta", 0.875),
    Setting("target", "below", "choice", ("ib_target",), ("below", "all")),
    Setting("warmup_epochs", 0, "int", ("ib_warmup",)),
    Setting("refresh_every", 0, "int", ("ib_refresh",)),
    Setting("max_weight", None, "optional", ("ib_max_weight",)),
)
_SB = (
    Setting("keep", 0.5, aliases=("sb_keep",)),
    Setting("start", 0.5, aliases=("sb_start",)),
    Setting("end", 0.9, aliases=("sb_end",)),
    Setting("scale_factor", 0.5, aliases=("sb_scale",)),
    Setting("interrupt", 2, "int", ("sb_interrupt",)),
)
_WINDOW = (  # online batch selection and the proxy select on every batch of the run by default
    Setting("keep", 0.5, aliases=("sel_keep",)),
    Setting("start", 0.0, aliases=("sel_start",)),
    Setting("end", 1.0, aliases=("sel_end",)),
    Setting("interrupt", 0, "int", ("sel_interrupt",)),
)
_SB_OPTIONS = ("sb_keep", "sb_start", "sb_end", "sb_scale", "sb_interrupt")  # the --sb-* options' keys
_BUDGETED = (Setting("prune_ratio", 0.3, aliases=("prune_fraction",)),)
_BANDIT = (*_BUDGETED, Setting("epsilon", 0.1), Setting("ema", 0.9, aliases=("score_ema",)))

_KINDS = (
    MethodKind(
        "baseline",
        "baseline",
        "plain training on every sample; budget=b trains b of its steps, its schedule ending there",
        (Setting("budget", 1.0, check=_budget),),
        default_run=True,
    ),
    MethodKind(
        "random",
        "pruning",
        "dynamic random pruning: InfoBatch's expected budget and rescaling, samples drawn uniformly",
        _INFOBATCH,
        policy=_rescaled(RandomPolicy),
        default_run=True,
    ),
    MethodKind(
        "infobatch",
        "pruning",
        "InfoBatch (Qin et al. 2024): drop a share of the below-mean-loss samples, rescale the rest",
        _INFOBATCH,
        policy=_rescaled(InfoBatchPolicy),
        twin="random",
        default_run=True,
    ),
    MethodKind(
        "sb",
        "selecting",
        "Selective Backprop (Jiang et al. 2019): backprop the hard rows, ranked by a downsampled pass",
        _SB,
        selector=_selective_backprop,
        default_run=True,
    ),
    MethodKind(
        "infobatch+sb",
        "both",
        "InfoBatch's pruning, then Selective Backprop on each served batch",
        (
            *_INFOBATCH,
            *_SB,
            Setting("stack_scores", "selection", "choice", choices=("selection", "trained"), check=_stack),
        ),
        policy=_rescaled(InfoBatchPolicy),
        selector=_selective_backprop,
        default_run=True,
    ),
    MethodKind(
        "rs2",
        "pruning",
        "RS2 (Okanovic et al. 2023): a fresh random subset each epoch, cycling through the data",
        _BUDGETED,
        policy=_rs2,
    ),
    MethodKind(
        "epsilon-greedy",
        "pruning",
        "epsilon-greedy pruning (Raju et al. 2021): keep the highest loss EMA, an epsilon share at random",
        _BANDIT,
        policy=_epsilon_greedy,
    ),
    MethodKind(
        "ucb",
        "pruning",
        "UCB pruning (Raju et al. 2021): keep the highest loss mean + c * std, an epsilon share at random",
        (*_BANDIT, Setting("c", 1.0, aliases=("ucb_c",))),
        policy=_ucb,
    ),
    MethodKind(
        "seta",
        "pruning",
        "SeTa (Zhou et al. 2025): a random subset, loss groups, a window sliding from easy to hard",
        (
            Setting("prune_ratio", 0.1, aliases=("seta_prune",)),
            Setting("num_groups", 5, "int", ("seta_groups",)),
            Setting("window_scale", 0.9, aliases=("seta_window",)),
            Setting("delta", 0.875),
        ),
        policy=_seta,
    ),
    MethodKind(
        "obs",
        "selecting",
        "online batch selection (Loshchilov & Hutter 2015): train the rows whose last loss ranks highest",
        (
            *_WINDOW,
            Setting("pressure", 100.0, aliases=("obs_pressure",)),
            Setting("final_pressure", None, "optional", ("obs_final_pressure",)),
        ),
        selector=_online_batch_selection,
        recorded=_SB_OPTIONS,
    ),
    MethodKind(
        "sb-proxy",
        "selecting",
        "Selective Backprop ranked by a narrow proxy model trained alongside (airbench)",
        (
            *_WINDOW,
            Setting("width", 0.25, aliases=("proxy_width",), check=_width),
            Setting("train_keep", 0.5, aliases=("proxy_keep",)),
            Setting("train_every", 1, "int", ("proxy_every",)),
        ),
        selector=_proxy,
        recorded=_SB_OPTIONS,
    ),
)
REGISTRY: dict[str, MethodKind] = {k.name: k for k in _KINDS}
