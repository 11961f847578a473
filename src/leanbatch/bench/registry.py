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
``twin`` (a :class:`Twin`) says how to make the row that makes the same choice uniformly at
random: InfoBatch's is ``random``, Selective Backprop's (and the proxy's, RHO-LOSS's) the
``uniform`` kind with the same window and keep, online batch selection's itself at
``pressure=1``. ``leanbatch bench --controls`` runs it beside its method
(:mod:`leanbatch.bench.controls`); what the choosing buys is the difference between the two.

Example:
    >>> REGISTRY["rs2"].family, [s.name for s in REGISTRY["rs2"].settings]
    ('pruning', ['prune_ratio'])
    >>> REGISTRY["rs2"].build_policy({"prune_ratio": 0.3}, num_epochs=8, seed=0)
    RS2Policy(prune_ratio=0.3, num_epochs=8, delta=1.0, seed=0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leanbatch.bench import builders as build
from leanbatch.bench.builders import PolicyBuilder, SelectorBuilder, SelectorContext, Settings
from leanbatch.checks import check_choice, check_real
from leanbatch.policies import InfoBatchPolicy, Policy, RandomPolicy
from leanbatch.selection import Selector

__all__ = [
    "FAMILIES",
    "MAX_BUDGET",
    "REGISTRY",
    "MethodKind",
    "SelectorContext",
    "Setting",
    "Twin",
]

FAMILIES = ("baseline", "pruning", "selecting", "both")
MAX_BUDGET = 4.0  # a budget above 1 trains longer than the baseline (a frontier reaching slower methods)


@dataclass(frozen=True)
class Setting:
    """One setting of a method: the library's name, the paper's default, the old bracket spellings.

    ``type`` reads the bracket text: ``"float"``, ``"int"``, ``"choice"`` (one of ``choices``) or
    ``"optional"`` (a float, or ``0``/``none`` for ``None``: the option off). ``check`` validates a
    bench-only setting (the library's objects check the others when they are built). ``shared``:
    the global option of its key (``--delta``...) sets it too (not for a setting whose default
    differs from the option's).

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
    shared: bool = True

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


@dataclass(frozen=True)
class Twin:
    """How a kind's uniform twin is made: the twin's ``kind``, the settings ``fixed`` to make its choice
    uniform (the rest are copied from the method's row where the twin has them, else its defaults)
    and the ``name`` its label ends with: ``<label>~<name>``.

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
        >>> REGISTRY["infobatch+sb"].prunes, REGISTRY["infobatch+sb"].selects, REGISTRY["infobatch"].twin.kind
        (True, True, 'random')
    """

    name: str
    family: str
    description: str
    settings: tuple[Setting, ...]
    policy: PolicyBuilder | None = None  # (settings, num_epochs, seed)
    selector: SelectorBuilder | None = None
    twin: Twin | None = None  # how to make the row that makes the same choice uniformly at random
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
        if self.name == "baseline" and settings["budget"] != 1.0 and settings["batch"] != 1.0:
            raise ValueError("a baseline row trains a budget of steps or a batch budget, not both")


# ---------------------------------------------------------------------------- settings
def _budget(v: Any) -> float:
    return check_real(v, "budget", 0.0, MAX_BUDGET, low_open=True, hint="a share of the baseline's steps")


def _batch(v: Any) -> float:
    return check_real(v, "batch", 0.0, MAX_BUDGET, low_open=True, hint="a share of the baseline's batch size")


def _width(v: Any) -> float:
    return check_real(v, "width", 0.0, 1.0, low_open=True, hint="the proxy's width, a share of the model's")


def _il_width(v: Any) -> float:
    return check_real(v, "il_width", 0.0, 1.0, low_open=True, hint="the holdout model's width, a share")


def _holdout(v: Any) -> float:
    hint = "the share of the training set the holdout model trains on"
    return check_real(v, "holdout", 0.0, 1.0, low_open=True, high_open=True, hint=hint)


def _il_epochs(v: Any) -> Any:
    if v is not None and (v != int(v) or v < 1):
        raise ValueError(f"il_epochs must be a whole number >= 1 or none (the run's epochs), got {v:g}")
    return v


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
_UNIFORM = tuple(Setting(s.name, s.default, s.type) for s in _WINDOW)  # the twin's: no old spellings
_PRESSURE_ONE = (("pressure", 1.0), ("final_pressure", None))  # the loss-rank draw made uniform
_SB_OPTIONS = ("sb_keep", "sb_start", "sb_end", "sb_scale", "sb_interrupt")  # the --sb-* options' keys
_BUDGETED = (Setting("prune_ratio", 0.3, aliases=("prune_fraction",)),)
_BANDIT = (*_BUDGETED, Setting("epsilon", 0.1), Setting("ema", 0.9, aliases=("score_ema",)))

_KINDS = (
    MethodKind(
        "baseline",
        "baseline",
        "plain training; budget=b: b of its steps; batch=b: its steps on batches of b x the batch size; "
        "the schedule ends at the run's end",
        (Setting("budget", 1.0, check=_budget), Setting("batch", 1.0, check=_batch)),
        default_run=True,
    ),
    MethodKind(
        "random",
        "pruning",
        "dynamic random pruning: InfoBatch's expected budget and rescaling, samples drawn uniformly",
        _INFOBATCH,
        policy=build.rescaled(RandomPolicy),
        default_run=True,
    ),
    MethodKind(
        "infobatch",
        "pruning",
        "InfoBatch (Qin et al. 2024): drop a share of the below-mean-loss samples, rescale the rest",
        _INFOBATCH,
        policy=build.rescaled(InfoBatchPolicy),
        twin=Twin("random", name="random"),
        default_run=True,
    ),
    MethodKind(
        "sb",
        "selecting",
        "Selective Backprop (Jiang et al. 2019): backprop the hard rows, ranked by a downsampled pass",
        _SB,
        selector=build.selective_backprop,
        twin=Twin("uniform"),
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
        policy=build.rescaled(InfoBatchPolicy),
        selector=build.selective_backprop,
        twin=Twin("infobatch+uniform"),
        default_run=True,
    ),
    MethodKind(
        "rs2",
        "pruning",
        "RS2 (Okanovic et al. 2023): a fresh random subset each epoch, cycling through the data",
        _BUDGETED,
        policy=build.rs2,
    ),
    MethodKind(
        "epsilon-greedy",
        "pruning",
        "epsilon-greedy pruning (Raju et al. 2021): keep the highest loss EMA, an epsilon share at random",
        _BANDIT,
        policy=build.epsilon_greedy,
    ),
    MethodKind(
        "ucb",
        "pruning",
        "UCB pruning (Raju et al. 2021): keep the highest loss mean + c * std, an epsilon share at random",
        (*_BANDIT, Setting("c", 1.0, aliases=("ucb_c",))),
        policy=build.ucb,
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
        policy=build.seta,
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
        selector=build.online_batch_selection,
        twin=Twin("obs", _PRESSURE_ONE),
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
        selector=build.proxy,
        twin=Twin("uniform"),
        recorded=_SB_OPTIONS,
    ),
    MethodKind(
        "obs-epoch",
        "pruning",
        "online batch selection per epoch: keep of the whole dataset drawn by loss rank, full batches",
        (
            Setting("keep", 0.7),
            Setting("pressure", 100.0),
            Setting("final_pressure", None, "optional"),
            Setting("delta", 1.0, shared=False),  # --delta (InfoBatch's 0.875) does not set it
        ),
        policy=build.loss_rank,
        twin=Twin("obs-epoch", _PRESSURE_ONE),
    ),
    MethodKind(
        "rho-loss",
        "selecting",
        "RHO-LOSS (Mindermann et al. 2022): train the rows of largest loss minus a holdout model's loss",
        (
            *_UNIFORM,
            Setting("scale_factor", 1.0),
            Setting("holdout", 0.1, check=_holdout),
            Setting("il_width", 0.25, check=_il_width),
            Setting("il_epochs", None, "optional", check=_il_epochs),
        ),
        selector=build.rho_loss,
        twin=Twin("uniform"),
    ),
    MethodKind(
        "uniform",
        "selecting",
        "the uniform twin of a batch selection: a random keep share of each batch, no scoring",
        _UNIFORM,
        selector=build.uniform,
    ),
    MethodKind(
        "infobatch+uniform",
        "both",
        "the twin of infobatch+sb: InfoBatch's pruning, then a random keep share of each served batch",
        (*_INFOBATCH, *(s for s in _SB if s.name != "scale_factor")),
        policy=build.rescaled(InfoBatchPolicy),
        selector=build.uniform,
    ),
)
REGISTRY: dict[str, MethodKind] = {k.name: k for k in _KINDS}
