"""Every method an arm can run, registered once: its family, its settings, how to build it, its twin.

A :class:`MethodKind` holds a method's name, its family (``baseline``, ``pruning``, ``selecting``,
``both`` or ``tokens``), a one-line description, its settings *named as the library names them* with the
papers' defaults, and the builders of the library objects: the pruning policy (for
:class:`~leanbatch.InfoBatch`), the selector (a :class:`~leanbatch.selection.Selector`) or the
token selection (a :class:`~leanbatch.TokenSelection`, trained through ``run.token_loss``). An arm
is validated by building them, so a bad value fails with the library's own one-line message.
``twin`` (a :class:`Twin`) makes its uniform twin (:mod:`~leanbatch.arms.twins`).

Example:
    >>> REGISTRY["rs2"].family, [s.name for s in REGISTRY["rs2"].settings]
    ('pruning', ['prune_ratio'])
    >>> REGISTRY["rs2"].policy({"prune_ratio": 0.3}, 8, 0)
    RS2Policy(prune_ratio=0.3, num_epochs=8, delta=1.0, seed=0)
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    LossRankPolicy,
    OnlineBatchSelection,
    ProxyScorer,
    RandomPolicy,
    RS2Policy,
    SelectiveBackprop,
    SeTaPolicy,
    TokenSelection,
    UCBPolicy,
)
from leanbatch.checks import check_choice, check_real
from leanbatch.policies import Policy
from leanbatch.selection import RhoLoss, Selector

__all__ = ["MAX_BUDGET", "REGISTRY", "MethodKind", "SelectorContext", "Setting", "Twin", "kinds_help"]

MAX_BUDGET = 4.0  # a budget above 1 trains longer than the baseline (a frontier reaching slower methods)
Settings = Mapping[str, Any]


class SelectorContext(NamedTuple):
    """What building a selector needs besides its settings: the arm's seed, the dataset's size (a
    memory of losses), how to make a proxy model of a given width with its optimizer (``sb-proxy``),
    and the irreducible losses of a ``rho-loss`` arm; the task provides the last two
    (:meth:`~leanbatch.engine.Run.select`); ``loss_fn``: Selective Backprop's (a framework's select()).
    """

    seed: int
    num_samples: int
    proxy: Callable[[float], tuple[nn.Module, torch.optim.Optimizer]] | None = None
    irreducible: Callable[[], Tensor] | None = None
    loss_fn: Callable[..., Tensor] | None = None


@dataclass(frozen=True)
class Setting:
    """One setting of a method: the library's name, the paper's default, how ``--methods`` reads it.

    ``type``: ``"float"``, ``"int"``, ``"choice"`` (text, checked to be one of ``choices`` when they are
    given) or ``"optional"`` (a float, or ``none``: off). ``check`` validates a setting no library
    object checks. ``option``: the global command-line option that sets it in every arm that has it
    (``--sb-keep`` sets ``keep`` of the Selective Backprop kinds).

    Example:
        >>> Setting("max_weight", None, "optional").describe()
        'max_weight=none'
    """

    name: str
    default: Any
    type: str = "float"
    choices: tuple[str, ...] = ()
    check: Callable[[Any], Any] | None = None
    option: str | None = None

    def describe(self) -> str:
        """``name=default``, for ``--help``."""
        return f"{self.name}={_shown(self.default)}"


def _shown(value: Any) -> str:
    return "none" if value is None else value if isinstance(value, str) else format(value, "g")


@dataclass(frozen=True)
class Twin:
    """How a kind's uniform twin is made: the twin's ``kind``, the settings ``fixed`` to make its choice
    uniform (the rest are copied from the method's arm where the twin has them) and the ``name`` its
    label ends with: ``<label>~<name>``.

    Example:
        >>> REGISTRY["obs"].twin
        Twin(kind='obs', fixed=(('pressure', 1.0), ('final_pressure', None)), name='uniform')
    """

    kind: str
    fixed: tuple[tuple[str, Any], ...] = ()
    name: str = "uniform"


@dataclass(frozen=True)
class MethodKind:
    """A registered method: see the module docstring.

    Example:
        >>> REGISTRY["infobatch+sb"].family, REGISTRY["infobatch"].twin.kind
        ('both', 'random')
    """

    name: str
    family: str
    description: str
    settings: tuple[Setting, ...]
    policy: Callable[[Settings, int, int], Policy] | None = None  # (settings, num_epochs, seed)
    selector: Callable[[Settings, SelectorContext], Selector] | None = None
    twin: Twin | None = None
    tokens: Callable[[Settings, int], TokenSelection] | None = None  # (settings, seed)
    default_run: bool = False  # one of the arms of a plain ``leanbatch bench``

    def setting(self, name: str) -> Setting | None:
        """The setting called ``name`` (``None``: not one of this kind's)."""
        return next((s for s in self.settings if s.name == name), None)

    def defaults(self) -> dict[str, Any]:
        """Every setting at its default."""
        return {s.name: s.default for s in self.settings}

    def check(self, settings: Settings) -> None:
        """Run the settings' own checks (the library checks the rest when its objects are built)."""
        for s in self.settings:
            if s.check is not None:
                s.check(settings[s.name])
            if s.choices:
                check_choice(settings[s.name], s.name, s.choices)
        if self.name == "baseline" and settings["budget"] != 1.0 and settings["batch"] != 1.0:
            raise ValueError("a baseline arm trains a budget of steps or a batch budget, not both")


# ---------------------------------------------------------------------------- builders
def _rescaled(cls: type[InfoBatchPolicy] | type[RandomPolicy]) -> Callable[[Settings, int, int], Policy]:
    def build(s: Settings, num_epochs: int, seed: int) -> Policy:
        return cls(
            s["prune_ratio"], num_epochs, s["delta"], target=s["target"], warmup_epochs=s["warmup_epochs"],
            refresh_every=s["refresh_every"], max_weight=s["max_weight"],
        )  # fmt: skip

    return build


def _window(s: Settings) -> dict[str, Any]:
    return {name: s[name] for name in ("keep", "start", "end", "interrupt")}


def _sb(s: Settings, ctx: SelectorContext) -> Selector:
    return SelectiveBackprop(**_window(s), scale_factor=s["scale_factor"], seed=ctx.seed, loss_fn=ctx.loss_fn)


def _uniform(s: Settings, ctx: SelectorContext) -> Selector:
    return SelectiveBackprop(**_window(s), rule="uniform", seed=ctx.seed, loss_fn=ctx.loss_fn)


def _obs(s: Settings, ctx: SelectorContext) -> Selector:
    p = s["pressure"]
    return OnlineBatchSelection(
        ctx.num_samples, **_window(s), pressure=p, final_pressure=s["final_pressure"], seed=ctx.seed
    )


def _proxy(s: Settings, ctx: SelectorContext) -> Selector:
    if ctx.proxy is None:
        raise ValueError(
            "sb-proxy ranks by a proxy model the task builds: pass run.select(..., proxy=make_proxy), "
            "make_proxy(width) -> (model, optimizer)"
        )
    model, opt = ctx.proxy(s["width"])
    scorer = ProxyScorer(
        model, opt, F.cross_entropy, train_every=s["train_every"], train_keep=s["train_keep"]
    )
    return SelectiveBackprop(**_window(s), rule="top", scorer=scorer, seed=ctx.seed, loss_fn=ctx.loss_fn)


def _rho(s: Settings, ctx: SelectorContext) -> Selector:
    if ctx.irreducible is None:
        raise ValueError(
            "rho-loss needs a holdout model's loss of every training sample: pass "
            "run.select(..., irreducible=losses_fn), losses_fn() -> a tensor of one loss per sample"
        )
    losses = ctx.irreducible()
    return RhoLoss(
        losses, **_window(s), loss_fn=F.cross_entropy, scale_factor=s["scale_factor"], seed=ctx.seed
    )


def _share(name: str, hint: str, high_open: bool = False, high: float = 1.0) -> Callable[[Any], float]:
    return lambda v: check_real(v, name, 0.0, high, low_open=True, high_open=high_open, hint=hint)


def _il_epochs(v: Any) -> Any:
    if v is not None and (v != int(v) or v < 1):
        raise ValueError(f"il_epochs must be a whole number >= 1 or none (the run's epochs), got {v:g}")
    return v


_INFOBATCH = (
    Setting("prune_ratio", 0.5, option="prune_ratio"),
    Setting("delta", 0.875, option="delta"),
    Setting("target", "below", "choice"),  # InfoBatchPolicy checks it, saying what each means
    Setting("warmup_epochs", 0, "int"),
    Setting("refresh_every", 0, "int"),
    Setting("max_weight", None, "optional"),
)
_SB = (
    Setting("keep", 0.5, option="sb_keep"),
    Setting("start", 0.5, option="sb_start"),
    Setting("end", 0.9, option="sb_end"),
    Setting("scale_factor", 0.5, option="sb_scale"),
    Setting("interrupt", 2, "int", option="sb_interrupt"),
)
_WINDOW = (Setting("keep", 0.5), Setting("start", 0.0), Setting("end", 1.0), Setting("interrupt", 0, "int"))
_PRESSURE_ONE = (("pressure", 1.0), ("final_pressure", None))  # the loss-rank draw made uniform
_BUDGETED = (Setting("prune_ratio", 0.3),)
_BANDIT = (*_BUDGETED, Setting("epsilon", 0.1), Setting("ema", 0.9))
_STACK = Setting("stack_scores", "selection", "choice", ("selection", "trained"), option="stack_scores")

_KINDS = (
    MethodKind(
        "baseline", "baseline",
        "plain training; budget=b: b of its steps; batch=b: its steps on batches of b x the batch size; "
        "the schedule ends at the run's end",
        (
            Setting("budget", 1.0, check=_share("budget", "a share of the baseline's steps", high=MAX_BUDGET)),
            Setting("batch", 1.0, check=_share("batch", "a share of the baseline's batch size", high=MAX_BUDGET)),
        ),
        default_run=True,
    ),
    MethodKind(
        "random", "pruning",
        "dynamic random pruning: InfoBatch's expected budget and rescaling, samples drawn uniformly",
        _INFOBATCH, policy=_rescaled(RandomPolicy), default_run=True,
    ),
    MethodKind(
        "infobatch", "pruning",
        "InfoBatch (Qin et al. 2024): drop a share of the below-mean-loss samples, rescale the rest",
        _INFOBATCH, policy=_rescaled(InfoBatchPolicy), twin=Twin("random", name="random"), default_run=True,
    ),
    MethodKind(
        "sb", "selecting",
        "Selective Backprop (Jiang et al. 2019): backprop the hard rows, ranked by a downsampled pass",
        _SB, selector=_sb, twin=Twin("uniform"), default_run=True,
    ),
    MethodKind(
        "infobatch+sb", "both", "InfoBatch's pruning, then Selective Backprop on each served batch",
        (*_INFOBATCH, *_SB, _STACK), policy=_rescaled(InfoBatchPolicy), selector=_sb,
        twin=Twin("infobatch+uniform"), default_run=True,
    ),
    MethodKind(
        "rs2", "pruning", "RS2 (Okanovic et al. 2023): a fresh random subset each epoch, cycling through the data",
        _BUDGETED, policy=lambda s, e, seed: RS2Policy(s["prune_ratio"], e, seed=seed),
    ),
    MethodKind(
        "epsilon-greedy", "pruning",
        "epsilon-greedy pruning (Raju et al. 2021): keep the highest loss EMA, an epsilon share at random",
        _BANDIT, policy=lambda s, e, seed: EpsilonGreedyPolicy(s["prune_ratio"], e, epsilon=s["epsilon"], ema=s["ema"]),
    ),
    MethodKind(
        "ucb", "pruning",
        "UCB pruning (Raju et al. 2021): keep the highest loss mean + c * std, an epsilon share at random",
        (*_BANDIT, Setting("c", 1.0)),
        policy=lambda s, e, seed: UCBPolicy(s["prune_ratio"], e, epsilon=s["epsilon"], ema=s["ema"], c=s["c"]),
    ),
    MethodKind(
        "seta", "pruning", "SeTa (Zhou et al. 2025): a random subset, loss groups, a window sliding from easy to hard",
        (Setting("prune_ratio", 0.1), Setting("num_groups", 5, "int"), Setting("window_scale", 0.9),
         Setting("delta", 0.875, option="delta")),
        policy=lambda s, e, seed: SeTaPolicy(s["prune_ratio"], e, s["num_groups"], s["window_scale"], s["delta"]),
    ),
    MethodKind(
        "obs", "selecting",
        "online batch selection (Loshchilov & Hutter 2015): train the rows whose last loss ranks highest",
        (*_WINDOW, Setting("pressure", 100.0), Setting("final_pressure", None, "optional")),
        selector=_obs, twin=Twin("obs", _PRESSURE_ONE),
    ),
    MethodKind(
        "sb-proxy", "selecting", "Selective Backprop ranked by a narrow proxy model trained alongside (airbench)",
        (*_WINDOW, Setting("width", 0.25, check=_share("width", "the proxy's width, a share of the model's")),
         Setting("train_keep", 0.5), Setting("train_every", 1, "int")),
        selector=_proxy, twin=Twin("uniform"),
    ),
    MethodKind(
        "obs-epoch", "pruning",
        "online batch selection per epoch: keep of the whole dataset drawn by loss rank, full batches",
        (Setting("keep", 0.7), Setting("pressure", 100.0), Setting("final_pressure", None, "optional"),
         Setting("delta", 1.0)),
        policy=lambda s, e, seed: LossRankPolicy(s["keep"], e, s["pressure"], s["final_pressure"], s["delta"]),
        twin=Twin("obs-epoch", _PRESSURE_ONE),
    ),
    MethodKind(
        "rho-loss", "selecting",
        "RHO-LOSS (Mindermann et al. 2022): train the rows of largest loss minus a holdout model's loss",
        (*_WINDOW, Setting("scale_factor", 1.0),
         Setting("holdout", 0.1, check=_share("holdout", "the share of the training set the holdout model trains on", True)),
         Setting("il_width", 0.25, check=_share("il_width", "the holdout model's width, a share")),
         Setting("il_epochs", None, "optional", check=_il_epochs)),
        selector=_rho, twin=Twin("uniform"),
    ),
    MethodKind(
        "uniform", "selecting", "the uniform twin of a batch selection: a random keep share of each batch, no scoring",
        _WINDOW, selector=_uniform,
    ),
    MethodKind(
        "infobatch+uniform", "both",
        "the twin of infobatch+sb: InfoBatch's pruning, then a random keep share of each served batch",
        (*_INFOBATCH, *(s for s in _SB if s.name != "scale_factor")),
        policy=_rescaled(InfoBatchPolicy), selector=_uniform,
    ),
    MethodKind(
        "token-selection", "tokens",
        "RHO-1's selective language modelling (Lin et al. 2024): train the tokens of largest loss minus a reference's",
        (Setting("keep", 0.6), Setting("start", 0.0), Setting("end", 1.0),
         Setting("policy", "excess", "choice", ("excess", "random"))),
        tokens=lambda s, seed: TokenSelection(s["keep"], s["start"], s["end"], policy=s["policy"], seed=seed),
        twin=Twin("token-selection", (("policy", "random"),)),
    ),
)  # fmt: skip
REGISTRY: dict[str, MethodKind] = {k.name: k for k in _KINDS}


def kinds_help(width: int = 100) -> str:
    """Every kind, its settings, its twin, no line wider than ``width``: the epilog of ``leanbatch bench --help``.

    Example:
        >>> kinds_help().splitlines()[1].split()[:2]
        ['baseline', 'baseline']
        >>> max(len(line) for line in kinds_help().splitlines()) <= 100
        True
    """
    pad = " " * 31

    def wrapped(head: str, text: str, indent: str = pad) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=head, subsequent_indent=indent)

    lines = [
        "method kinds (--methods NAME or NAME[setting=value,...]; a bracketed item is an arm of its own):"
    ]
    for k in REGISTRY.values():
        lines += wrapped(f"  {k.name:<17} {k.family:<10} ", k.description)
    lines += ["", "settings (the library's names and the papers' defaults):"]
    for k in REGISTRY.values():
        lines += wrapped(f"  {k.name:<17} ", ", ".join(s.describe() for s in k.settings), " " * 20)
    lines += [
        "",
        *textwrap.wrap("--prune-ratio, --delta, --sb-* and --stack-scores set that setting in every arm that "
                       "has it; max_weight and final_pressure take none for off; il_epochs none: the run's epochs.", width),
        "",
        "uniform twins (--controls runs each beside its method: what the choosing buys is the difference):",
    ]  # fmt: skip
    for k in REGISTRY.values():
        if k.twin is not None:
            fixed = ",".join(f"{name}={_shown(v)}" for name, v in k.twin.fixed)
            twin = f"{k.twin.kind}{f'[{fixed}]' if fixed else ''}"
            lines += wrapped(
                f"  {k.name} -> {k.name}~{k.twin.name} ", f"({twin} with the method's other settings)", "    "
            )
    return "\n".join(lines)
