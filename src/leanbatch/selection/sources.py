"""Sources of per-row scores: where the losses a rule ranks come from.

:class:`ForwardScores` runs the no-grad selection forward of the model being trained (inputs
downsampled by ``scale_factor``; BatchNorm statistics and modes untouched); :class:`ScorerScores`
calls ``scorer(inputs, target)``, e.g. a :class:`~leanbatch.selection.ProxyScorer`;
:class:`MemoryScores` reads the last trained loss of each dataset index (online batch selection,
no forward); :class:`StaleScores` (Stale-SB) reuses those for ``staleness`` epochs and has another
source score the rest. Memories are indexed by CPU dataset indices, as a DataLoader yields them, so
deciding what to read or score reads nothing from the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from leanbatch.checks import check_autocast, check_bool, check_fraction, check_int
from leanbatch.scores import ScoreTable
from leanbatch.selection.batches import first_tensor, index_batch, slice_batch
from leanbatch.selection.layout import Rows
from leanbatch.selection.scoring import (
    PerExampleLoss,
    as_per_example_loss,
    check_downsample,
    check_losses,
    check_model,
    default_forward,
    model_output,
    preserved_training_state,
    scaled_forward,
)
from leanbatch.selection.stats import SelectionStats

_NEVER = -(2**62)  # epoch stamp of an index never scored (fails every freshness test)


class Source:
    """A selector's source of scores: ``scores(rows, model, loss_fn, stats)`` counts what it did
    (``stats.forwarded``, ``stats.reused``); ``check_batch`` runs on every batch, ``check`` (a dry
    run) on the first; ``runs_model``: it runs the model being trained. The base keeps no memory.

    Example:
        >>> Source.runs_model, Source().table is None
        (False, True)
    """

    runs_model = False
    table: ScoreTable | None = None

    def check_batch(self, rows: Rows, loss_fn: Any) -> None:
        """Host-side checks of every batch, whatever the progress."""

    def check(self, rows: Rows, model: Any, loss_fn: Any) -> None:
        """The first batch's dry run."""

    def scores(self, rows: Rows, model: Any, loss_fn: Any, stats: SelectionStats) -> Tensor:
        """Float32 ``(rows.n,)`` scores of the batch, with no host-device sync."""
        raise NotImplementedError

    def record(self, indices: Tensor, losses: Tensor, epoch: int = 0) -> None:
        """Store trained losses in the memory (sources with one)."""
        raise ValueError(
            "record_losses is for a memory of losses (rule='loss_rank', Stale-SB): this selector has none"
        )

    def state_dict(self) -> dict[str, Any]:
        """What to checkpoint, by name (``"scorer"``, ``"memory"``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""


class ForwardScores(Source):
    """The selection forward of the model being trained; arguments as in
    :class:`~leanbatch.selection.SelectiveBackprop`, ``loss_name`` names the loss in errors.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> fwd = ForwardScores(scale_factor=1.0, loss_fn=F.cross_entropy)
        >>> fwd.losses(torch.nn.Linear(3, 3), torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), 4).shape
        torch.Size([4])
    """

    runs_model = True

    def __init__(
        self,
        scale_factor: float = 1.0,
        loss_fn: Callable[..., Tensor] | None = None,
        *,
        forward_fn: Callable[[Any, Any], Any] | None = None,
        chunk_size: int | None = None,
        autocast: torch.dtype | bool | None = None,
        eval_mode: bool = False,
        loss_name: str = "loss_fn",
    ):
        self.scale_factor = check_fraction(scale_factor, "scale_factor")
        self.loss_name = loss_name
        self.loss_fn = loss_fn  # the default loss as given (checked against the model)
        self._last: tuple[Any, PerExampleLoss] | None = None  # the loss last adapted, and its adaptation
        if loss_fn is not None:
            self._last = (loss_fn, as_per_example_loss(loss_fn, loss_name))
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable as forward_fn(model, inputs), got {forward_fn!r}")
        self.forward_fn = forward_fn
        self.chunk_size = None if chunk_size is None else check_int(chunk_size, "chunk_size", 1)
        self.autocast = check_autocast(autocast)
        self.eval_mode = check_bool(eval_mode, "eval_mode")

    def loss(self, loss_fn: Callable[..., Tensor] | None) -> PerExampleLoss:
        """``loss_fn`` as per-example losses (checked once per function), else the default one."""
        fn = self.loss_fn if loss_fn is None else loss_fn
        if fn is None:
            raise TypeError("no loss function: pass loss_fn to select() or to SelectiveBackprop(loss_fn=)")
        if self._last is None or self._last[0] is not fn:
            self._last = (fn, as_per_example_loss(fn, self.loss_name))
        return self._last[1]

    def losses(
        self, model: Any, inputs: Any, target: Any, n: int, loss_fn: Any = None, dry_run: bool = False
    ) -> Tensor:
        """Float32 ``(n,)`` losses of one no-grad selection pass (training state kept; no host
        sync), ``chunk_size`` rows per forward; ``dry_run``: in eval mode, unchunked."""
        loss, forward = self.loss(loss_fn), self.forward_fn or default_forward
        eval_mode = isinstance(model, nn.Module) if dry_run else self.eval_mode
        step = n if dry_run or self.chunk_size is None else max(1, min(self.chunk_size, n))
        lead = first_tensor(inputs)
        device = lead.device if lead is not None else torch.device("cpu")
        precision: Any = contextlib.nullcontext()
        if self.autocast is not None:
            dtype = None if isinstance(self.autocast, bool) else self.autocast
            precision = torch.autocast(device.type, dtype=dtype, enabled=self.autocast is not False)
        parts: list[Tensor] = []
        with torch.no_grad(), preserved_training_state(model, eval_mode), precision:
            for start in range(0, n, step):
                stop = min(n, start + step)
                x = inputs if step == n else slice_batch(inputs, start, stop, n)
                y = target if step == n else slice_batch(target, start, stop, n)
                out = model_output(scaled_forward(forward, model, x, self.scale_factor))
                parts.append(check_losses(loss(out, y), stop - start, self.loss_name))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def check_batch(self, rows: Rows, loss_fn: Any) -> None:
        self.loss(loss_fn)  # no loss function: fail now, whatever the progress

    def check(self, rows: Rows, model: Any, loss_fn: Any) -> None:
        given = self.loss_fn if loss_fn is None else loss_fn
        check_model(model, given, self.loss_name, custom_forward=self.forward_fn is not None)
        check_downsample(rows.inputs, self.scale_factor)
        m = min(rows.n, 2)
        inputs, target = slice_batch(rows.inputs, 0, m, rows.n), slice_batch(rows.target, 0, m, rows.n)
        self.losses(model, inputs, target, m, loss_fn, dry_run=True)

    def scores(self, rows: Rows, model: Any, loss_fn: Any, stats: SelectionStats) -> Tensor:
        stats.forwarded += rows.n
        return self.losses(model, rows.inputs, rows.target, rows.n, loss_fn)


class ScorerScores(Source):
    """Scores from ``scorer(inputs, target) -> (N,) losses`` (e.g. a ``ProxyScorer``, whose state is saved).

    Example:
        >>> import torch
        >>> from leanbatch.selection.layout import read_rows
        >>> rows = read_rows((torch.ones(3, 2), torch.zeros(3)), (None, None))
        >>> ScorerScores(lambda x, y: x.sum(1)).scores(rows, None, None, SelectionStats())
        tensor([2., 2., 2.])
    """

    def __init__(self, scorer: Callable[[Any, Any], Tensor]):
        if not callable(scorer):
            raise TypeError(
                f"scorer must be callable as scorer(inputs, target) -> per-example losses, got {scorer!r}"
            )
        self.scorer = scorer

    def scores(self, rows: Rows, model: Any, loss_fn: Any, stats: SelectionStats) -> Tensor:
        stats.forwarded += rows.n
        return check_losses(self.scorer(rows.inputs, rows.target), rows.n, "scorer").detach()

    def state_dict(self) -> dict[str, Any]:
        get = getattr(self.scorer, "state_dict", None)
        return {"scorer": get() if callable(get) else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load = getattr(self.scorer, "load_state_dict", None)
        if state.get("scorer") is not None and callable(load):
            load(state["scorer"])


class MemoryScores(Source):
    """The last trained loss of each dataset index (a :class:`~leanbatch.scores.ScoreTable` of
    ``num_samples``, or ``table``, e.g. InfoBatch's); never trained: ``+inf``, the hardest.
    ``method`` names the method in error messages.

    Example:
        >>> import torch
        >>> m = MemoryScores(num_samples=4)
        >>> m.record(torch.tensor([0, 2]), torch.tensor([0.5, 2.0]))
        >>> m.losses(torch.tensor([2, 3])).tolist()
        [2.0, inf]
    """

    def __init__(
        self,
        num_samples: int | None = None,
        table: ScoreTable | None = None,
        *,
        method: str = "OnlineBatchSelection",
    ):
        self.method = method
        if table is None:
            if num_samples is None:
                raise ValueError(
                    f"{method} keeps one loss per dataset index: pass num_samples=len(dataset) or score_table="
                )
            table = ScoreTable(check_int(num_samples, "num_samples", 1))
        elif not isinstance(table, ScoreTable):
            raise TypeError(f"score_table must be a leanbatch.scores.ScoreTable, got {type(table).__name__}")
        self.table: ScoreTable = table
        self.num_samples = table.num_samples

    def losses(self, indices: Tensor) -> Tensor:
        """The remembered losses of ``indices`` (float32, on the table's device); never scored: +inf."""
        return torch.nan_to_num(self.table.get(indices), nan=float("inf"))

    def check_batch(self, rows: Rows, loss_fn: Any) -> None:
        check_row_indices(rows, f"{self.method} ranks rows by the last trained loss of their dataset index")

    def scores(self, rows: Rows, model: Any, loss_fn: Any, stats: SelectionStats) -> Tensor:
        assert rows.indices is not None  # check_batch ran
        stats.reused += rows.n
        return self.losses(rows.indices).to(rows.device, non_blocking=True)

    def record(self, indices: Tensor, losses: Tensor, epoch: int = 0) -> None:
        """Store ``losses`` as the last trained losses of ``indices`` (the epoch is not kept)."""
        self.table.update(indices, losses)

    def state_dict(self) -> dict[str, Any]:
        return {"memory": {"table": self.table.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.table.load_state_dict(state["memory"]["table"])


def check_row_indices(rows: Rows, why: str) -> Tensor:
    """The batch's dataset indices, a tensor of shape ``(rows.n,)``; ``ValueError`` saying ``why``
    they are needed when they are missing.
    """
    indices, n = rows.indices, rows.n
    if indices is None:
        raise ValueError(f"{why}: it needs the batch's dataset indices, select(..., indices=dataset_indices)")
    if not isinstance(indices, Tensor) or tuple(indices.shape) != (n,):
        shape = tuple(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__
        raise ValueError(f"indices must be a tensor of shape ({n},) (one per example), got {shape}")
    return indices


class StaleScores(MemoryScores):
    """Stale-SB: a memory of losses reused for ``staleness`` epochs; ``source`` scores the rest.

    An index is *fresh* in epoch ``e`` when scored in epoch ``e0`` with ``0 <= e - e0 < staleness``
    (``staleness=2``: measured in epoch 4, reused in 5, measured again in 6).

    Example:
        >>> import torch
        >>> s = StaleScores(num_samples=6, staleness=2)
        >>> s.record(torch.tensor([0, 1]), torch.tensor([0.5, 2.0]), epoch=3)
        >>> s.fresh(torch.tensor([0, 1, 2]), epoch=4).tolist(), s.fresh(torch.tensor([0]), epoch=5).tolist()
        ([True, True, False], [False])
    """

    def __init__(
        self,
        num_samples: int | None = None,
        staleness: int = 2,
        table: ScoreTable | None = None,
        *,
        source: Source | None = None,
    ):
        super().__init__(num_samples, table, method="Stale-SB")
        self.staleness = check_int(staleness, "staleness", 1)
        self.source = source
        self.runs_model = source is not None and source.runs_model
        self.scored_epoch = torch.full((self.num_samples,), _NEVER, dtype=torch.int64)

    def _check(self, indices: Any) -> Tensor:
        if not isinstance(indices, Tensor) or indices.dim() != 1 or indices.is_floating_point():
            raise TypeError("indices must be a 1-D integer tensor of dataset indices")
        self.table.check_indices(indices)
        if indices.device != self.scored_epoch.device:  # follow the indices (normally the CPU)
            self.scored_epoch = self.scored_epoch.to(indices.device)
        return indices

    def fresh(self, indices: Tensor, epoch: int) -> Tensor:
        """Bool mask: which ``indices`` hold a loss measured less than ``staleness`` epochs ago."""
        return self._fresh(self._check(indices), check_int(epoch, "epoch", 0))

    def _fresh(self, indices: Tensor, epoch: int) -> Tensor:
        age = epoch - self.scored_epoch[indices.long()]
        return (age >= 0) & (age < self.staleness)

    def record(self, indices: Tensor, losses: Tensor, epoch: int = 0) -> None:
        """Store ``losses`` of ``indices`` as measured in ``epoch`` (stamped without reading them)."""
        self._record(self._check(indices), losses, check_int(epoch, "epoch", 0))

    def _record(self, indices: Tensor, losses: Tensor, epoch: int) -> None:
        self.table.update(indices, losses)
        self.scored_epoch.index_fill_(0, indices.long(), epoch)

    def check_batch(self, rows: Rows, loss_fn: Any) -> None:
        if rows.indices is None or rows.epoch is None:
            raise ValueError(
                "Stale-SB (staleness >= 2) needs select(..., indices=dataset_indices, epoch=epoch)"
            )
        self._check(check_row_indices(rows, "Stale-SB"))
        check_int(rows.epoch, "epoch", 0)
        if self.source is not None:
            self.source.check_batch(rows, loss_fn)

    def check(self, rows: Rows, model: Any, loss_fn: Any) -> None:
        if self.source is not None:
            self.source.check(rows, model, loss_fn)

    def scores(self, rows: Rows, model: Any, loss_fn: Any, stats: SelectionStats) -> Tensor:
        assert rows.indices is not None and rows.epoch is not None and self.source is not None
        n, idx = rows.n, rows.indices
        todo = (~self._fresh(idx, rows.epoch)).nonzero().squeeze(1)  # checked indices: no device read on CPU
        n_todo = int(todo.shape[0])
        if n_todo:
            sub = rows
            if n_todo < n:  # the rows to score, model inputs and target only
                at = todo.to(rows.device, non_blocking=True)
                sub = Rows(
                    index_batch(rows.inputs, at, n), index_batch(rows.target, at, n), n_todo, rows.device
                )
            self._record(
                idx.index_select(0, todo), self.source.scores(sub, model, loss_fn, stats), rows.epoch
            )
        stats.reused += n - n_todo
        return self.losses(idx).to(rows.device, non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        state = {**({} if self.source is None else self.source.state_dict()), **super().state_dict()}
        state["memory"].update(staleness=self.staleness, scored_epoch=self.scored_epoch.cpu().clone())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.source is not None:
            self.source.load_state_dict(state)
        super().load_state_dict(state)
        stamps = state["memory"]["scored_epoch"]
        if tuple(stamps.shape) != (self.num_samples,):
            raise ValueError(f"state_dict is for {stamps.shape[0]} samples, not {self.num_samples}")
        self.scored_epoch = stamps.to(self.scored_epoch.device, torch.int64).clone()
