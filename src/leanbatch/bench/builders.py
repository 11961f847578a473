"""How the registry (:mod:`leanbatch.bench.registry`) builds the library's objects from a row's settings.

Each function takes a row's settings by the library's names: a pruning policy builder also takes
the run's ``num_epochs`` and ``seed``; a selector builder takes a :class:`SelectorContext`, what
building a selector needs besides its settings (the seed, the dataset's size, how to make a proxy
model, and how to get the irreducible losses of RHO-LOSS).

Example:
    >>> rs2({"prune_ratio": 0.3}, 8, 0)
    RS2Policy(prune_ratio=0.3, num_epochs=8, delta=1.0, seed=0)
    >>> loss_rank({"keep": 0.7, "pressure": 1.0, "final_pressure": None, "delta": 1.0}, 8, 0).pressure
    1.0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch.policies import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    LossRankPolicy,
    Policy,
    RandomPolicy,
    RS2Policy,
    SeTaPolicy,
    UCBPolicy,
)
from leanbatch.selection import OnlineBatchSelection, ProxyScorer, RhoLoss, SelectiveBackprop, Selector

__all__ = [
    "IrreducibleFactory",
    "PolicyBuilder",
    "ProxyFactory",
    "SelectorBuilder",
    "SelectorContext",
    "Settings",
    "epsilon_greedy",
    "loss_rank",
    "online_batch_selection",
    "proxy",
    "rescaled",
    "rho_loss",
    "rs2",
    "selective_backprop",
    "seta",
    "ucb",
    "uniform",
]

Settings = Mapping[str, Any]
ProxyFactory = Callable[[float], tuple[nn.Module, torch.optim.Optimizer]]  # width -> proxy, its optimiser
IrreducibleFactory = Callable[[Settings], Tensor]  # a rho-loss row's settings -> one loss per sample
PolicyBuilder = Callable[[Settings, int, int], Policy]  # (settings, num_epochs, seed)


class SelectorContext(NamedTuple):
    """What building a selector needs besides its settings: the run's seed, the dataset's size (a
    memory of losses), how to make a proxy model of a given width with its optimiser, and the
    irreducible losses of a ``rho-loss`` row (the bench trains the holdout model there; ``None``:
    no row needs them).

    Example:
        >>> import torch
        >>> def proxy(width):
        ...     model = torch.nn.Linear(2, 2)
        ...     return model, torch.optim.SGD(model.parameters(), lr=0.1)
        >>> ctx = SelectorContext(seed=0, num_samples=100, proxy=proxy)
        >>> online_batch_selection({"keep": 0.5, "start": 0.0, "end": 1.0, "interrupt": 0,
        ...     "pressure": 100.0, "final_pressure": None}, ctx).keep
        0.5
    """

    seed: int
    num_samples: int
    proxy: ProxyFactory
    irreducible: IrreducibleFactory | None = None


SelectorBuilder = Callable[[Settings, SelectorContext], Selector]


# ---------------------------------------------------------------------------- pruning policies
def rescaled(cls: type[InfoBatchPolicy] | type[RandomPolicy]) -> PolicyBuilder:
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


def rs2(s: Settings, num_epochs: int, seed: int) -> Policy:
    """RS2: a fresh random subset each epoch."""
    return RS2Policy(s["prune_ratio"], num_epochs, seed=seed)


def epsilon_greedy(s: Settings, num_epochs: int, seed: int) -> Policy:
    """Epsilon-greedy pruning."""
    return EpsilonGreedyPolicy(s["prune_ratio"], num_epochs, epsilon=s["epsilon"], ema=s["ema"])


def ucb(s: Settings, num_epochs: int, seed: int) -> Policy:
    """UCB pruning."""
    return UCBPolicy(s["prune_ratio"], num_epochs, epsilon=s["epsilon"], ema=s["ema"], c=s["c"])


def seta(s: Settings, num_epochs: int, seed: int) -> Policy:
    """SeTa."""
    return SeTaPolicy(s["prune_ratio"], num_epochs, s["num_groups"], s["window_scale"], s["delta"])


def loss_rank(s: Settings, num_epochs: int, seed: int) -> Policy:
    """Online batch selection per epoch: ``keep`` of the dataset drawn by loss rank (``obs-epoch``)."""
    return LossRankPolicy(s["keep"], num_epochs, s["pressure"], s["final_pressure"], s["delta"])


# ---------------------------------------------------------------------------- selectors
def _window(s: Settings) -> dict[str, Any]:
    """The settings every selector shares: the share kept and the window (start, end, interrupt)."""
    return {name: s[name] for name in ("keep", "start", "end", "interrupt")}


def selective_backprop(s: Settings, ctx: SelectorContext) -> Selector:
    """Selective Backprop, ranked by a downsampled selection pass."""
    return SelectiveBackprop(**_window(s), scale_factor=s["scale_factor"], seed=ctx.seed)


def uniform(s: Settings, ctx: SelectorContext) -> Selector:
    """The uniform twin of a batch selection: the same window and keep, rows drawn at random."""
    return SelectiveBackprop(**_window(s), rule="uniform", seed=ctx.seed)


def online_batch_selection(s: Settings, ctx: SelectorContext) -> Selector:
    """Online batch selection within each batch, from a memory of last trained losses."""
    return OnlineBatchSelection(
        ctx.num_samples,
        **_window(s),
        pressure=s["pressure"],
        final_pressure=s["final_pressure"],
        seed=ctx.seed,
    )


def proxy(s: Settings, ctx: SelectorContext) -> Selector:
    """Selective Backprop's top rule, ranked by a narrow proxy model trained alongside."""
    model, optimizer = ctx.proxy(s["width"])
    scorer = ProxyScorer(
        model, optimizer, F.cross_entropy, train_every=s["train_every"], train_keep=s["train_keep"]
    )
    return SelectiveBackprop(**_window(s), rule="top", scorer=scorer, seed=ctx.seed)


def rho_loss(s: Settings, ctx: SelectorContext) -> Selector:
    """RHO-LOSS: the irreducible losses from ``ctx.irreducible`` (the holdout model's), then top-k."""
    if ctx.irreducible is None:
        raise ValueError(
            "rho-loss needs the irreducible losses of a holdout model (SelectorContext.irreducible)"
        )
    return RhoLoss(
        ctx.irreducible(s),
        **_window(s),
        loss_fn=F.cross_entropy,
        scale_factor=s["scale_factor"],
        seed=ctx.seed,
    )
