"""The run contract: what a task is given, one arm at one seed (:class:`Run`).

A task is a function ``train(run) -> metric`` the user writes (AlgoPerf's *workload*: model, data,
loss, evaluation); the arm (AlgoPerf's *submission*: the method, its budget, its selection hook)
comes in through ``run``. The smallest change to a loop that already uses leanbatch::

    def train(run):
        torch.manual_seed(run.seed)
        model, opt = make_model(), make_opt()
        ds = run.wrap(train_set, num_epochs)                  # the arm's data: its policy, its budget
        loader = DataLoader(ds, batch_size=run.batch_size(128), sampler=ds.sampler)
        sched = ProgressLR(opt, ds, cosine(warmup=0.03))
        for epoch in range(ds.epoch, num_epochs):
            ds.set_epoch(epoch)
            for x, y in loader:
                loss = ds.update(F.cross_entropy(model(x), y, reduction="none"))
                opt.zero_grad(); loss.backward(); opt.step(); sched.step()
            with run.untimed():
                acc = evaluate(model)
            run.log(epoch=epoch, metric=acc)                  # the curve; the engine may switch arms here
        return acc

The clock (training only) starts at ``run.wrap`` (with ``run.callback`` / ``run.trainer``: when the fit starts) and runs
while this arm has its turn, but for ``run.untimed()`` blocks, until the task returns.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from leanbatch import InfoBatch
from leanbatch.arms.methods import Arm
from leanbatch.arms.registry import SelectorContext
from leanbatch.engine.judging.records import EpochRecord, RunRecord
from leanbatch.engine.running.data import (
    Budget,
    ContractError,
    CountedInfoBatch,
    HookMissing,
    StudyError,
)
from leanbatch.engine.running.selecting import Pick, select
from leanbatch.engine.running.tally import Tally
from leanbatch.ranks import world_size
from leanbatch.selection import Selector
from leanbatch.selection.tokens import TokenSelection

__all__ = ["Clock", "Run"]


class Clock:
    """Training wall-clock and process CPU time, accumulated over the spans it runs (``untimed``:
    the wall-clock of the blocks off it)."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.untimed = 0.0
        self.started, self.depth = False, 0
        self._since: tuple[float, float] | None = None

    def start(self) -> None:
        """Start it (once; later calls change nothing)."""
        if not self.started:
            self.started = True
            self.resume()

    def resume(self) -> None:
        """Run again after :meth:`pause`, unless it never started or an untimed block is open."""
        if self.started and self.depth == 0 and self._since is None:
            self._since = (time.perf_counter(), time.process_time())

    def pause(self) -> None:
        """Stop counting (the device's queued work first)."""
        if self._since is not None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            w, c = self._since
            self.wall += time.perf_counter() - w
            self.cpu += time.process_time() - c
            self._since = None

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """A block off the clock (blocks nest)."""
        t0 = time.perf_counter()
        self.pause()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.untimed += time.perf_counter() - t0
            self.resume()


def _number(value: Any, what: str) -> float:
    """``value`` as a float: a Python number or a one-element tensor; ContractError otherwise."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


class Run:
    """One arm at one seed, as the task sees it (see the module docstring for the loop).

    Attributes:
        seed: the seed of this run: seed the model's initialisation and the task's own randomness with it.
        label: the arm's label (``"infobatch"``, ``"baseline[budget=0.5]"``...).
        kind: the arm's method kind; ``settings``: its settings (read-only), for tasks that need them.

    Example:
        >>> from leanbatch.arms.methods import parse_methods
        >>> run = Run(parse_methods("baseline[batch=0.5]")[0], seed=0)
        >>> run.batch_size(128), run.label
        (64, 'baseline[batch=0.5]')
    """

    def __init__(
        self,
        arm: Arm,
        seed: int,
        metric: str = "metric",
        on_log: Callable[[Run], None] | None = None,
        *,
        metric_option: str = "metric={!r}",
        optional: bool = False,
    ):
        self.arm, self.seed, self.metric_name, self._on_log = arm, int(seed), metric, on_log
        # how the study names its metric ("--metric {}" on the command line); a default method, left
        # out (HookMissing) when the task has no hook for it
        self._metric_option, self._optional = metric_option, optional
        self.label, self.kind, self.settings = arm.label, arm.kind, dict(arm.settings)
        self.data: Any = None  # the arm's data (run.wrap) or a framework's (run.callback, run.trainer)
        self.epochs: list[EpochRecord] = []
        self.notes: dict[str, Any] = {}
        self.charged: dict[str, float] = {}
        self.clock = Clock()
        self.turn: Callable[[], None] = lambda: None  # the scheduler's: run.log hands the turn on
        self._batch: int | None = None  # the task's batch size (run.batch_size)
        self._selector: Selector | None = None
        self._tokens: TokenSelection | None = None  # a token arm's, built at its first run.token_loss
        self._sizes: tuple[int, int] | None = None  # (samples, epochs) of the full run
        self._min_batch = 1
        self._batches = 0  # run.select calls since the last run.log (a batch's index in its epoch)
        self._selected = self._stepped = False  # run.select called; a step trained
        self._tally = Tally()
        self._policy: Any = None  # a pruning arm's policy (its pruning epochs: the histograms')
        self._load = [_load_avg()]

    # ------------------------------------------------------------------ data
    def wrap(self, dataset: Any, num_epochs: int, *, min_batch: int = 1) -> InfoBatch:
        """The arm's data over ``dataset`` for ``num_epochs`` epochs (starts the clock): an
        :class:`~leanbatch.InfoBatch` with the arm's policy for a pruning arm, else one that keeps every
        sample and serves the arm's budget (:class:`~leanbatch.engine.running.data.CountedInfoBatch`).
        Use it as one: ``sampler=ds.sampler``, ``ds.set_epoch(epoch)``, ``ds.update(per_sample_loss)``.
        ``min_batch``: a last batch of an epoch with fewer rows is not trained (2 for BatchNorm).
        """
        self._bind(dataset, num_epochs)
        self._min_batch = int(min_batch)
        budget = Budget(self.arm.budget, self.arm.batch, self._min_batch)
        options = {} if self.arm.prunes else {"budget": budget, "batch_size": lambda: self._batch}
        self.data = self._arm_data(dataset, num_epochs, **options)
        self.clock.start()
        return self.data

    def callback(
        self, dataset: Any, num_epochs: int, *, loss_fn: Any = None, proxy: Any = None, **kwargs: Any
    ) -> Any:
        """The arm as a Lightning :class:`~leanbatch.lightning.LeanBatchCallback` over ``dataset``
        (``Trainer(max_epochs=num_epochs, callbacks=[lb])``; the clock starts with the fit): see
        :mod:`~leanbatch.engine.running.frameworks`. ``loss_fn=``: Selective Backprop's, for ``lb.select``."""
        from leanbatch.engine.running.frameworks import framework_selector, lightning_callback

        self._bind(dataset, num_epochs)
        self.data = self._arm_data(dataset, num_epochs)
        selector = framework_selector(self.arm, self._selector_for(loss_fn=loss_fn, proxy=proxy))
        return lightning_callback(self, self.data, selector, **kwargs)

    def trainer(self, *, args: Any, train_dataset: Any, trainer_class: Any = None, **kwargs: Any) -> Any:
        """The arm as a Hugging Face ``Trainer`` (``LeanBatchTrainer`` for a pruning or selecting arm;
        ``max_steps`` for a budget arm), built with ``args``, ``train_dataset`` and the Trainer's other
        arguments (the clock starts with its ``train()``; ``trainer_class``: your own ``Trainer``
        subclass): see :mod:`~leanbatch.engine.running.frameworks`."""
        from leanbatch.engine.running.frameworks import framework_selector, hf_trainer

        epochs = args.num_train_epochs
        if float(epochs) != int(epochs):
            raise ContractError(f"args.num_train_epochs={epochs}: the arms plan whole epochs; use an integer")
        epochs = int(epochs)
        self._bind(train_dataset, epochs)
        data = self._arm_data(train_dataset, epochs, shard=False) if self.arm.prunes else None
        selector = framework_selector(self.arm, self._selector_for(proxy=kwargs.pop("proxy", None)))
        if not (self.arm.prunes or self.arm.selects) and self._batch is None:
            self._batch = int(args.per_device_train_batch_size)
        trainer, self.data = hf_trainer(self, args, train_dataset, data, selector, trainer_class, **kwargs)
        return trainer

    def _bind(self, dataset: Any, num_epochs: Any) -> None:
        """Check and keep the full run's size: ``dataset``'s samples and ``num_epochs``."""
        if self._sizes is not None:
            raise ContractError("run.wrap / run.callback / run.trainer is called once per run")
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
            raise ContractError(f"num_epochs must be an int >= 1, got {num_epochs!r}")
        if not hasattr(dataset, "__len__") or len(dataset) < 1:
            raise ContractError("run.wrap takes a map-style dataset with at least one sample (len() and [i])")
        self._sizes = (len(dataset), num_epochs)

    def _arm_data(self, dataset: Any, num_epochs: int, **options: Any) -> CountedInfoBatch:
        """The arm's InfoBatch: the arm's policy, or every sample kept with weight 1 (``options``: a
        ``budget``'s, else a framework's)."""
        if self.arm.prunes:
            options["policy"] = self._policy = self.arm.policy(num_epochs, self.seed)
        elif "budget" not in options:
            options.update(prune_ratio=0.0, policy="random")
        return CountedInfoBatch(dataset, num_epochs, seed=self.seed, on_step=self._step, **options)

    def _step(self, rows: int) -> None:
        """Every training step of the arm's data, before it trains: the checks only a step can make."""
        if not self._stepped:
            self._stepped = True
            stats = None if self._selector is None else self._selector.stats
            if self.arm.selects and not self._selected and (stats is None or stats.batches == 0):
                raise (HookMissing if self._optional else StudyError)(
                    "it selects rows of each batch, but the task trained a step without run.select(...), the "
                    "batch-level selection hook: add it to the loop (docs/bench.md) or leave the arm out"
                )
            if self.arm.selects_tokens and self._tokens is None:
                raise StudyError(
                    "it selects tokens, but the task trained a step without run.token_loss(ds, logits, labels), "
                    "the token hook: compute the loss with it (docs/language-models.md) or leave the arm out"
                )
        if self._batch is not None and rows > (most := Budget(batch=self.arm.batch).rows(self._batch)):
            raise StudyError(
                f"trained a batch of {rows} rows where run.batch_size({self._batch}) gave {most}: build the "
                "DataLoader with batch_size=run.batch_size(B)"
            )

    def _selector_for(self, **context: Any) -> Selector | None:
        """The arm's selector (None for an arm that does not select), built at the first call."""
        if self.arm.selects and self._selector is None:
            if self._sizes is None:
                raise ContractError("run.select needs run.wrap(dataset, num_epochs) first")
            ctx = SelectorContext(self.seed, self._sizes[0], context.get("proxy"), context.get("irreducible"),
                                  context.get("loss_fn"))  # fmt: skip
            self._selector = self.arm.selector(ctx)
        return self._selector

    def batch_size(self, size: int) -> int:
        """The training loader's batch size for this arm: ``round(b x size)`` for a batch budget
        ``baseline[batch=b]``, ``size`` otherwise."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ContractError(f"run.batch_size takes the batch size, an int >= 1, got {size!r}")
        self._batch = size if self._batch is None else self._batch
        return Budget(batch=self.arm.batch).rows(size)

    @property
    def total_steps(self) -> int | None:
        """The arm's optimizer steps when its length is fixed in steps (a step or batch budget), for a
        task that lays its schedule over a step count; None when it trains ``num_epochs`` epochs (a
        pruning arm's epochs are shorter: read ``ds.progress``). Needs ``run.wrap`` and ``run.batch_size``."""
        if not self.arm.limited:
            return None
        if self._sizes is None or self._batch is None:
            raise ContractError("run.total_steps needs run.wrap(...) and run.batch_size(...) first")
        if isinstance(self.data, CountedInfoBatch) and self.data.budget is not None:
            return self.data.total_steps  # the loader's own steps, once its first epoch showed them
        samples = math.ceil(self._sizes[0] / world_size())
        return Budget(self.arm.budget, self.arm.batch, self._min_batch).total_steps(
            samples, self._sizes[1], self._batch
        )

    # ------------------------------------------------------------------ the clock
    def untimed(self) -> contextlib.AbstractContextManager[None]:
        """A block off the clock: evaluation, checkpoints, logging (blocks nest)."""
        return self.clock.off()

    # ------------------------------------------------------------------ selection
    def select(
        self,
        batch: Any,
        model: Any = None,
        loss_fn: Callable[..., Tensor] | None = None,
        *,
        indices: Tensor | None = None,
        progress: float | None = None,
        batch_idx: int | None = None,
        proxy: Callable[[float], Any] | None = None,
        irreducible: Callable[[], Tensor] | None = None,
        lr: float | None = None,
    ) -> Pick:
        """The rows of ``batch`` this arm trains on (:class:`~leanbatch.engine.running.selecting.Pick`): a
        batch-level arm's selection, every row for the others. ``indices``: the rows' dataset indices
        (online batch selection and stacking on InfoBatch need them); ``progress`` (default: the arm's
        data's) and ``batch_idx`` (default: the batch's place since the last ``run.log``) place the
        batch in the selection window; ``proxy(width) -> (model, optimizer)`` builds ``sb-proxy``'s
        proxy and ``irreducible() -> losses`` gives ``rho-loss`` its holdout losses (both called once);
        ``lr``: the main run's learning rate, which a proxy follows."""
        idx = self._batches if batch_idx is None else batch_idx
        self._batches, self._selected = self._batches + 1, True
        selector = self._selector_for(proxy=proxy, irreducible=irreducible)
        if selector is None:
            return Pick(batch, None, indices)
        p = self.progress if progress is None else progress
        return select(selector, self.settings, batch, model, loss_fn, p, idx, indices, self._min_batch, lr)

    def token_loss(
        self, data: Any, logits: Tensor, labels: Tensor | None = None, *, shift_labels: Tensor | None = None,
        indices: Tensor | None = None, reference: Callable[[], Any] | None = None, reference_cost: float = 1.0,
    ) -> Tensor:  # fmt: skip
        """The loss to backpropagate from a causal LM's ``logits`` and ``labels`` (or ``shift_labels``):
        a token arm's selected tokens, each sequence's mean token loss through ``data`` for the others;
        ``reference() -> logits`` is called (and charged at ``reference_cost``) only when ranking by
        excess loss (:mod:`~leanbatch.engine.running.tokens`)."""
        from leanbatch.engine.running.tokens import token_step

        if self.arm.selects_tokens and self._tokens is None:
            self._tokens = self.arm.token_selection(self.seed)
            self.note(token_keep=self._tokens.keep, token_policy=self._tokens.policy)
        args = (logits, labels, shift_labels, indices, reference, reference_cost)
        return token_step(self.progress, self.charge, self._tokens, data, *args)

    @property
    def progress(self) -> float:
        """The fraction of this arm trained: its data's ``progress`` (0 before ``run.wrap``)."""
        return 0.0 if self.data is None else float(self.data.progress)

    # ------------------------------------------------------------------ records
    def charge(self, forwarded: float = 0.0, backpropagated: float = 0.0, cost: float = 1.0) -> None:
        """Work done outside the arm's data (a holdout model): its samples forwarded and backpropagated,
        each at ``cost`` FLOPs of one of the model's; counted in the run's work fractions."""
        for key, value in (("forwarded", forwarded), ("backpropagated", backpropagated)):
            self.charged[key] = self.charged.get(key, 0.0) + _number(value, key)
        self.charged["cost"] = _number(cost, "cost")

    def note(self, **values: Any) -> None:
        """Numbers or strings about the whole run, kept in its record (``runs[].notes``)."""
        self.notes.update(values)

    def log(self, epoch: int | None = None, **values: Any) -> None:
        """Record an epoch's numbers: the metric (``metric=``, or the study's metric name; ``None`` for
        an epoch not evaluated) and any others; then the engine may run another arm's epoch before
        this call returns. Numbers without the metric stop the study (it is misnamed)."""
        self.clock.pause()
        named = self.metric_name in values or "metric" in values
        metric = values.pop(self.metric_name, values.pop("metric", None))
        if not named and values:  # an epoch not evaluated says so: run.log(metric=None, ...)
            raise StudyError(
                f"run.log(...) gave {', '.join(values)} but no {self.metric_name!r}: {self._name_it(values)}"
            )
        if isinstance(self.data, CountedInfoBatch):
            self.data.end_epoch()  # the epoch just trained, if the loader's pass over it is over
        counts = self._count()
        threshold, pruning = self._tally.plans(self.data, self._policy)
        self.epochs.append(
            EpochRecord(
                epoch=len(self.epochs) if epoch is None else int(epoch),
                metric=None if metric is None else _number(metric, f"run.log's {self.metric_name}"),
                train_time_s=self.clock.wall,
                train_cpu_time_s=self.clock.cpu,
                threshold=threshold,
                pruning=pruning,
                values={k: _number(v, f"run.log's {k}") for k, v in values.items()},
                **counts,
            )  # fmt: skip
        )
        self._batches = 0
        if self._on_log is not None:
            self._on_log(self)
        self.turn()
        self.clock.resume()

    def _count(self) -> dict[str, int]:
        stats = None if self._selector is None else self._selector.stats
        return self._tally.epoch(self.data, stats, self.arm.limited)

    def finish(self, returned: Any) -> RunRecord:
        """The run's record from what the task returned, after checking the contract."""
        self.clock.pause()
        metric = self._final(returned)
        from leanbatch.engine.running.contract import check_trained

        check_trained(self.arm, self.data, self._selector, lambda: self.total_steps)
        self._count()  # the steps after the last run.log, into the totals
        samples, epochs = self._sizes if self._sizes is not None else (None, None)
        samples = None if samples is None else math.ceil(samples / world_size())  # each process's share
        self._load.append(_load_avg())
        scale = float(self.settings.get("scale_factor", 1.0)) ** 2
        return RunRecord(
            method=self.label, kind=self.kind, seed=self.seed, metric=metric, epochs=self.epochs,
            budget=self.arm.budget, batch=self.arm.batch, train_time_s=self.clock.wall,
            train_cpu_time_s=self.clock.cpu, untimed_s=self.clock.untimed, num_samples=samples,
            num_epochs=epochs, scale=scale, charged=dict(self.charged), counts=dict(self._tally.totals),
            histograms=self._tally.histograms, load_avg=self._load, notes=dict(self.notes),
        )  # fmt: skip

    def _name_it(self, values: Any) -> str:
        """How to name the metric among ``values`` (a task's logged or returned names)."""
        names = [str(k) for k in values]
        if len(names) == 1:
            return f"name it with {self._metric_option.format(names[0])}"
        return f"name the one to judge with {self._metric_option.format('NAME')} ({', '.join(names)})"

    def _final(self, returned: Any) -> float:
        name = self.metric_name
        if isinstance(returned, Mapping):
            if name not in returned:
                got = ", ".join(map(str, returned)) or "nothing"
                raise StudyError(
                    f"the task returned {{{got}}} but not the metric {name!r}: {self._name_it(returned)}"
                )
            returned = returned[name]
        if returned is None:
            raise StudyError(f"the task returned no number: return the final {name} (or a dict holding it)")
        value = _number(returned, f"the task's returned {name}")
        if not math.isfinite(value):
            raise ContractError(f"the task returned {value} as its {name}: a finite number is needed")
        return value


def _load_avg() -> float:
    """The machine's 1-minute load average (-1 where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0
