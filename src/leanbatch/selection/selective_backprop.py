"""``SelectiveBackprop``: the schedule object a training loop calls once per batch, a factory
whose arguments choose the parts of a :class:`~leanbatch.selection.selector.Selector`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_choice, check_int
from leanbatch.scores import ScoreTable
from leanbatch.selection.history import HistoryRule
from leanbatch.selection.layout import Key, check_keys
from leanbatch.selection.rules import LossRankRule, RankRule, Rule, TopRule, UniformRule
from leanbatch.selection.schedule import Window
from leanbatch.selection.selector import Selector
from leanbatch.selection.sources import ForwardScores, MemoryScores, ScorerScores, Source, StaleScores

__all__ = ["SelectiveBackprop"]

_RULES = ("rank", "history", "top", "loss_rank", "uniform")
_MEASURED = ("rank", "history", "top")  # the rules that rank losses measured now (or stale ones)


class SelectiveBackprop(Selector):
    """Selective Backprop (Jiang et al. 2019) as a schedule object for any training loop.

    The arguments choose the parts of a :class:`~leanbatch.selection.selector.Selector`:

    - schedule (:class:`~leanbatch.selection.schedule.Window`): ``start <= progress < end``
      (fractions of training), and every ``interrupt``-th batch trains in full (0 = never;
      Composer's exact rule);
    - rule, keeping ``max(1, int(keep * N))`` of a batch (``keep`` in (0, 1]; 1 disables
      selection): ``"rank"`` (Composer's, sync-free), ``"top"`` (the hardest ``keep`` share),
      ``"loss_rank"`` (online batch selection, ``selection_pressure`` >= 1 decaying to
      ``final_pressure``: an alias of :class:`~leanbatch.selection.OnlineBatchSelection`, same
      draws), ``"uniform"`` (a uniform random share: the twin every rule is compared with, no
      scoring at all); or ``"history"``, the paper's ``cdf ** beta`` against the last
      ``history_size`` losses (about ``1 / (beta + 1)`` kept; ``keep`` does not apply; pair it
      with :meth:`iterate`);
    - source: the model's no-grad selection forward on inputs downsampled by ``scale_factor``
      (float 3-D to 5-D inputs), with ``loss_fn(output, target, reduction="none")`` (or a loss
      module; checked here), ``forward_fn(model, inputs)`` (default ``model(inputs)``, or
      ``model(**inputs)`` for a dict), ``chunk_size`` examples per forward, ``autocast``
      (``None``: the caller's context; a dtype or ``True``; ``False``: full precision) and
      ``eval_mode``; or ``scorer(inputs, target) -> (N,) losses`` instead (e.g. a
      :class:`~leanbatch.selection.ProxyScorer`); with ``staleness >= 2`` (Stale-SB) a memory
      reuses each loss for that many epochs (``select(..., indices=, epoch=)``); ``"loss_rank"``
      reads a memory of last trained losses (``select(..., indices=)``, :meth:`record_losses`).
      A memory needs ``num_samples`` or a ``score_table`` (share InfoBatch's);
    - layout: ``input_key`` (position, key or list of keys; default 0, or every tensor but the
      target of a dict, Hugging Face style) and ``target_key`` (default 1, or ``"labels"``); a
      bare tensor batch is both input and target;
    - draws: ``seed`` (default ``leanbatch.rng.DEFAULT_SEED``; draw ``t`` on rank ``r`` is seeded
      with ``mix_seed(seed, r, t)``) and ``rank`` (default: the process group's, read at the
      first draw); ``timing``: measure selection time (syncs a CUDA device);
    - scope: ``"local"`` (default) keeps ``keep`` of each rank's batch; ``"global"`` ranks the
      whole step's rows of the ranks of ``group`` (default: the world) together, each rank
      training its rows of that one choice (varying counts; a rank left without any trains its
      hardest row with weight 0): train on :meth:`step_loss`
      (:mod:`~leanbatch.selection.scope`). Without a process group it is ``"local"``.

    Arguments the chosen parts do not use are neither used nor validated; ``keep``,
    ``scale_factor``, ``staleness``, ``scorer`` read the parts (``keep`` is ``None`` for
    ``"history"``, ``scale_factor`` 1.0 without a selection forward). Errors surface early:
    arguments here; layout, downsampling and loss output on the first :meth:`select` (whatever
    the progress) or :meth:`check`.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
        ...                             torch.nn.Flatten(), torch.nn.Linear(4, 10))
        >>> sb = SelectiveBackprop(start=0.5, end=0.9, keep=0.5, scale_factor=0.5, interrupt=2)
        >>> batch = (torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,)))
        >>> (x, y), positions, losses = sb.select(batch, model, F.cross_entropy, progress=0.6, batch_idx=0)
        >>> x.shape[0], positions.shape[0], losses.shape[0]
        (8, 8, 16)
        >>> sb.select(batch, model, F.cross_entropy, progress=0.6, batch_idx=1).positions is None  # interrupt
        True
        >>> twin = SelectiveBackprop(start=0.5, end=0.9, keep=0.5, interrupt=2, rule="uniform")
        >>> twin.select(batch, model, progress=0.6, batch_idx=0).batch[0].shape[0]  # no selection pass
        8
    """

    def __init__(
        self,
        start: float = 0.5,
        end: float = 0.9,
        keep: float = 0.5,
        scale_factor: float = 0.5,
        interrupt: int = 2,
        *,
        rule: str = "rank",
        beta: float = 3.0,
        history_size: int = 1024,
        staleness: int = 1,
        num_samples: int | None = None,
        score_table: ScoreTable | None = None,
        loss_fn: Callable[..., Tensor] | None = None,
        input_key: Key | Sequence[str] | None = None,
        target_key: Key | None = None,
        forward_fn: Callable[[Any, Any], Any] | None = None,
        chunk_size: int | None = None,
        autocast: torch.dtype | bool | None = None,
        eval_mode: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        timing: bool = False,
        selection_pressure: float = 100.0,
        final_pressure: float | None = None,
        scorer: Callable[[Any, Any], Tensor] | None = None,
        scope: str = "local",
        group: Any = None,
    ):
        check_choice(rule, "rule", _RULES)
        check_int(staleness, "staleness", 1)
        fresh: Source | None = None  # what measures losses, for the rules that rank measured ones
        if rule in _MEASURED and scorer is not None:
            fresh = ScorerScores(scorer)
        elif rule in _MEASURED:
            fresh = ForwardScores(
                scale_factor,
                loss_fn,
                forward_fn=forward_fn,
                chunk_size=chunk_size,
                autocast=autocast,
                eval_mode=eval_mode,
            )
        super().__init__(
            Window(start, end, interrupt),
            _source(rule, staleness, num_samples, score_table, scorer, fresh),
            _rule(rule, keep, beta, history_size, selection_pressure, final_pressure),
            keys=check_keys(input_key, target_key),
            seed=seed,
            rank=rank,
            group=group,
            timing=timing,
            scope=scope,
        )

    def __repr__(self) -> str:
        return (
            f"SelectiveBackprop(start={self.start}, end={self.end}, keep={self.keep}, "
            f"scale_factor={self.scale_factor}, interrupt={self.interrupt}, rule={self.rule!r}, "
            f"staleness={self.staleness}{self.selection_scope.suffix})"
        )

    @property
    def rule(self) -> str:
        """The rule's name: ``"rank"``, ``"history"``, ``"top"``, ``"loss_rank"`` or ``"uniform"``."""
        return self.selection_rule.name

    @property
    def input_key(self) -> Key | Sequence[str] | None:
        """Where the model input is in a batch (``None``: the default)."""
        return (self.keys or (None, None))[0]

    @property
    def target_key(self) -> Key | None:
        """Where the target is in a batch (``None``: the default)."""
        return (self.keys or (None, None))[1]

    def _fresh(self) -> Source | None:
        return self.source.source if isinstance(self.source, StaleScores) else self.source

    @property
    def scale_factor(self) -> float:
        """The selection forward's downsampling factor (1.0 when selection runs no forward)."""
        fresh = self._fresh()
        return fresh.scale_factor if isinstance(fresh, ForwardScores) else 1.0

    @property
    def scorer(self) -> Callable[[Any, Any], Tensor] | None:
        """The callable that scores in place of the model (``None``: the model or no scoring)."""
        fresh = self._fresh()
        return fresh.scorer if isinstance(fresh, ScorerScores) else None

    @property
    def staleness(self) -> int:
        """Stale-SB's staleness in epochs (1: every loss is measured afresh, or none is)."""
        return self.source.staleness if isinstance(self.source, StaleScores) else 1


def _rule(
    rule: str, keep: float, beta: float, history_size: int, pressure: float, final_pressure: float | None
) -> Rule:
    if rule == "history":
        return HistoryRule(history_size, beta)
    if rule == "loss_rank":
        return LossRankRule(keep, pressure, final_pressure)
    return {"rank": RankRule, "top": TopRule, "uniform": UniformRule}[rule](keep)


def _source(
    rule: str,
    staleness: int,
    num_samples: int | None,
    table: ScoreTable | None,
    scorer: Any,
    fresh: Source | None,
) -> Source | None:
    memory = num_samples is not None or table is not None
    if fresh is None:  # loss_rank, uniform
        if staleness > 1 or scorer is not None:
            raise ValueError(f"rule={rule!r} runs no scoring pass: drop staleness/scorer")
        if rule == "loss_rank":
            return MemoryScores(num_samples, table, method="SelectiveBackprop(rule='loss_rank')")
        if memory:
            raise ValueError("rule='uniform' reads no losses: drop num_samples/score_table")
        return None
    if staleness > 1:
        return StaleScores(num_samples, staleness, table, source=fresh)
    if memory:
        raise ValueError(
            "num_samples/score_table are for Stale-SB or rule='loss_rank': also pass staleness >= 2"
        )
    return fresh
