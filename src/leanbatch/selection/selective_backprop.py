"""``SelectiveBackprop``: the schedule object a training loop calls once per batch.

Selection is active while ``start <= progress < end`` (fractions of training),
except on *interrupt* batches, which train on the whole batch: Composer's rule,
exactly (see :mod:`~leanbatch.selection.window`; ``interrupt=2`` alternates
selected and vanilla batches, ``interrupt=0`` selects on every batch).

Selection rules:

- ``rule="rank"`` (default; Composer's): keep ``max(1, int(keep * N))`` of each
  batch, drawn by loss rank - sync-free;
- ``rule="history"`` (the paper's): keep each example with probability
  ``cdf ** beta`` against a ring buffer of recent losses. Pair it with
  :meth:`SelectiveBackprop.iterate`, which accumulates selected examples into
  full-size batches as the paper's code does;
- ``rule="top"``: keep the hardest ``max(1, int(keep * N))`` (the airbench proxy runs);
- ``rule="loss_rank"``: online batch selection (Loshchilov & Hutter, 2015): rank by the
  *last known* loss of each dataset index, drawn with probability decaying exponentially
  with the rank (:mod:`~leanbatch.selection.online`); no selection forward pass at all.

Scorers: the model itself on a downsampled copy (default), or ``scorer=`` any callable
``(inputs, target) -> losses``, e.g. a :class:`~leanbatch.selection.ProxyScorer`, a small
model trained alongside the main one.

Stale-SB (``staleness > 1``) reuses per-index losses measured within the last
``staleness`` epochs and skips their selection forward pass.

Randomness: each draw uses a private generator reseeded from
``mix_seed(seed, rank, draw)`` - the object's seed, the process's rank (from an
initialised ``torch.distributed`` group, read at the first draw, or ``rank=``)
and the number of active batches so far. Ranks of a DDP job therefore select
independently, and the state to resume is one integer that is the same on every
rank: a checkpoint saved by rank 0 resumes every rank exactly.

The window rule, the batch layout and the loader wrapper live in
:mod:`~leanbatch.selection.window`, :mod:`~leanbatch.selection.layout` and
:mod:`~leanbatch.selection.loader`; their public names are re-exported here.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import torch
from torch import Tensor

from leanbatch.scores import ScoreTable
from leanbatch.selection._checks import check_fraction, check_int, check_interval
from leanbatch.selection.batches import first_tensor, index_batch
from leanbatch.selection.history import LossHistory
from leanbatch.selection.layout import Key, Selection, batch_size, split_batch
from leanbatch.selection.loader import iterate_selected
from leanbatch.selection.online import check_pressure, pressure_at, select_by_loss_rank
from leanbatch.selection.passes import SelectionPass
from leanbatch.selection.rank import num_selected, select_hardest, select_indices
from leanbatch.selection.rng import DEFAULT_SEED, canonical_device, process_rank, rank_seed
from leanbatch.selection.stale import StaleScores
from leanbatch.selection.stats import SelectionStats
from leanbatch.selection.window import should_selective_backprop, training_progress

__all__ = ["SelectiveBackprop", "Selection", "should_selective_backprop", "training_progress"]

_RULES = ("rank", "history", "top", "loss_rank")
_FIXED_K = ("rank", "top", "loss_rank")  # rules that keep max(1, int(keep * N)) of a batch


class SelectiveBackprop(SelectionPass):
    """Selective Backprop (Jiang et al. 2019) as a schedule object for any training loop.

    Args:
        start: progress (fraction of training) at which selection starts.
        end: progress at which it stops (``start <= progress < end`` is active).
        keep: fraction of each batch the rank rule keeps, in (0, 1]; ``keep=1``
            disables selection (as in Composer).
        scale_factor: in (0, 1]; the selection pass sees inputs downsampled by it
            (float 3-D to 5-D inputs only).
        interrupt: every ``interrupt``-th batch of an epoch trains on the whole
            batch; 0 = never (exact rule: :mod:`~leanbatch.selection.window`).
        rule: ``"rank"`` (Composer's rank rule), ``"history"`` (the paper's
            ``cdf ** beta`` against recent losses; ``keep`` does not apply), ``"top"``
            (the hardest ``keep`` share, deterministic) or ``"loss_rank"`` (online batch
            selection by the last known loss of each index: no forward pass; needs
            ``num_samples`` or ``score_table``, ``select(..., indices=)`` and the trained
            losses stored with :meth:`record_losses` or by a shared InfoBatch table).
        selection_pressure: ``loss_rank``: the hardest example's odds over the easiest
            (Loshchilov & Hutter's ``s_e``; default 100 = their ``s_e0 = 10**2``).
        final_pressure: ``loss_rank``: decay the pressure exponentially to this value at
            the end of training (default None: constant).
        scorer: score with this callable, ``scorer(inputs, target) -> (N,) losses``,
            instead of the model (e.g. :class:`~leanbatch.selection.ProxyScorer`);
            ``scale_factor`` and the loss function then do not apply.
        beta: exponent of the history rule (3 in the authors' code; about
            ``1 / (beta + 1)`` of the examples are kept).
        history_size: losses remembered by the history rule (1,024).
        staleness: Stale-SB: reuse a per-index loss measured within this many
            epochs (``1`` = always score). Needs ``num_samples`` or ``score_table``
            and ``select(..., indices=, epoch=)``.
        num_samples: dataset size, for Stale-SB's score table.
        score_table: a ``leanbatch.scores.ScoreTable`` to keep Stale-SB's losses
            in (share InfoBatch's to give both methods one memory).
        loss_fn: default loss for :meth:`select`, ``loss_fn(output, target,
            reduction="none")`` or a loss module; its signature is checked here.
        input_key: where the model input is: tuple/list position (default 0), or
            for dict batches a key or list of keys (default: every tensor value
            except the target, passed as ``model(**inputs)``, Hugging Face style).
            A bare tensor batch is both input and target.
        target_key: where the target is (default 1, or ``"labels"`` for dicts).
        forward_fn: ``forward_fn(model, inputs) -> output`` when calling the model
            needs more than ``model(inputs)`` / ``model(**inputs)``.
        chunk_size: score at most this many examples per selection forward.
        autocast: precision of the selection pass: ``None`` = the caller's
            autocast context, a dtype or ``True`` = that autocast, ``False`` = full.
        eval_mode: score in eval mode (running BN statistics, no dropout).
        seed: seed of this object's private generators (one per device); ``None``
            uses ``leanbatch.selection.rng.DEFAULT_SEED``. Draw ``t`` on rank ``r``
            is seeded with ``mix_seed(seed, r, t)``.
        rank: the rank whose draws this object makes; ``None`` (default) reads
            ``torch.distributed.get_rank()`` at the first draw (0 without an
            initialised process group), so the object may be built before the
            group is. Pass the data-parallel rank when several processes share
            a batch and must keep the same rows (tensor/pipeline parallelism).
        timing: measure selection time (synchronises a CUDA device around it).

    Errors surface early: hyperparameters and the loss signature here, the batch
    layout, downsampling and the loss output shape on the first ``select`` call
    (whatever the progress) or an explicit :meth:`check`.

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
    ):
        super().__init__(
            scale_factor=scale_factor,
            loss_fn=loss_fn,
            input_key=input_key,
            target_key=target_key,
            forward_fn=forward_fn,
            chunk_size=chunk_size,
            autocast=autocast,
            eval_mode=eval_mode,
            scorer=scorer,
        )
        self.start, self.end = check_interval(start, end)
        self.keep = check_fraction(keep, "keep")
        self.interrupt = check_int(interrupt, "interrupt", 0)
        if self.interrupt == 1:
            warnings.warn(
                "interrupt=1 makes every batch a vanilla batch ((batch_idx + 1) % 1 == 0): selection never "
                "runs. Use interrupt=0 to select on every batch of the window.",
                stacklevel=2,
            )
        if rule not in _RULES:
            raise ValueError(f"rule must be one of {', '.join(map(repr, _RULES))}, got {rule!r}")
        self.rule = rule
        self._history = LossHistory(history_size, beta) if rule == "history" else None
        self.selection_pressure = check_pressure(selection_pressure)
        self.final_pressure = (
            None if final_pressure is None else check_pressure(final_pressure, "final_pressure")
        )
        check_int(staleness, "staleness", 1)
        self._stale: StaleScores | None = None
        if rule == "loss_rank":
            if staleness > 1 or scorer is not None:
                raise ValueError(
                    "rule='loss_rank' never scores (it reads the last known losses): drop staleness/scorer"
                )
            if num_samples is None and score_table is None:
                raise ValueError(
                    "rule='loss_rank' ranks by the last known loss per index: pass num_samples= or score_table="
                )
            self._stale = StaleScores(num_samples, 1, score_table)
        elif staleness > 1:
            self._stale = StaleScores(num_samples, staleness, score_table)
        elif score_table is not None or num_samples is not None:
            raise ValueError("num_samples/score_table are for Stale-SB: also pass staleness >= 2")
        self.staleness = staleness
        self.seed = DEFAULT_SEED if seed is None else check_int(seed, "seed", 0)
        self.rank = None if rank is None else check_int(rank, "rank", 0)
        self.timing = bool(timing)
        self.stats = SelectionStats()
        self._generators: dict[torch.device, torch.Generator] = {}
        self._draw_rank: int | None = None  # resolved at the first draw
        self._draws = 0
        self._device: torch.device | None = None

    def __repr__(self) -> str:
        return (
            f"SelectiveBackprop(start={self.start}, end={self.end}, keep={self.keep}, "
            f"scale_factor={self.scale_factor}, interrupt={self.interrupt}, rule={self.rule!r}, "
            f"staleness={self.staleness})"
        )

    # ------------------------------------------------------------------ schedule
    @property
    def runs_model(self) -> bool:
        """Whether selection runs the model: not with a ``scorer`` nor with ``rule="loss_rank"``."""
        return self.scorer is None and self.rule != "loss_rank"

    def is_active(self, progress: float, batch_idx: int) -> bool:
        """Whether :meth:`select` selects on this batch (window, interrupt, ``keep < 1``).

        Example:
            >>> sb = SelectiveBackprop(start=0.5, end=0.9, interrupt=3)
            >>> [sb.is_active(0.6, i) for i in range(4)], sb.is_active(0.9, 0)
            ([True, True, False, True], False)
        """
        if self.rule in _FIXED_K and self.keep >= 1.0:
            return False
        return should_selective_backprop(progress, batch_idx, self.start, self.end, self.interrupt)

    # ------------------------------------------------------------------ selection
    def _generator(self, device: torch.device, draw: int) -> torch.Generator:
        """The generator for draw number ``draw``, reseeded from ``(seed, rank, draw)``: host work only."""
        if self._draw_rank is None:  # lazily: frameworks initialise the process group after building us
            self._draw_rank = process_rank() if self.rank is None else self.rank
        dev = canonical_device(device)
        gen = self._generators.get(dev)
        if gen is None:
            gen = self._generators[dev] = torch.Generator(device=dev)
        gen.manual_seed(rank_seed(self.seed, self._draw_rank, draw))
        return gen

    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def select(
        self,
        batch: Any,
        model: Any,
        loss_fn: Callable[..., Tensor] | None = None,
        progress: float | None = None,
        batch_idx: int | None = None,
        *,
        indices: Tensor | None = None,
        epoch: int | None = None,
    ) -> Selection:
        """Select the rows of ``batch`` to train on; returns ``Selection(batch, positions, losses)``.

        Args:
            batch: a tensor, tuple/list or dict of tensors (see ``input_key``).
            model: the model being trained (left in its mode, BN statistics kept).
            loss_fn: ``loss_fn(output, target, reduction="none")``; default: the
                constructor's ``loss_fn``.
            progress: fraction of training done (see :func:`training_progress`).
            batch_idx: index of the batch within its epoch (for ``interrupt``).
            indices: dataset indices of the rows (Stale-SB); keep them on the CPU,
                as the DataLoader yields them, to decide freshness without a sync.
            epoch: current epoch (Stale-SB).

        Order in the loop: select first, then batch-level augmentation (mixup,
        cutmix) on the selected batch, then the training step.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> model = torch.nn.Linear(4, 3)
            >>> sb = SelectiveBackprop(keep=0.25, scale_factor=1.0, interrupt=0, loss_fn=F.cross_entropy,
            ...                        input_key="x", target_key="y")
            >>> batch = {"x": torch.randn(8, 4), "y": torch.randint(0, 3, (8,)), "w": torch.ones(8)}
            >>> out = sb.select(batch, model, progress=0.7, batch_idx=3)
            >>> sorted(out.batch), out.batch["w"].shape, out.positions.tolist() == sorted(out.positions.tolist())
            (['w', 'x', 'y'], torch.Size([2]), True)
        """
        if progress is None or batch_idx is None:
            raise TypeError("select() needs progress= (fraction of training done) and batch_idx=")
        if isinstance(progress, bool) or not isinstance(progress, (int, float)):
            raise TypeError(f"progress must be a Python float (fraction of training done), got {progress!r}")
        check_int(batch_idx, "batch_idx", 0)
        return self._select(batch, model, loss_fn, progress, batch_idx, indices, epoch, at_least_one=True)

    def _select(
        self,
        batch: Any,
        model: Any,
        loss_fn: Callable[..., Tensor] | None,
        progress: float,
        batch_idx: int,
        indices: Tensor | None,
        epoch: int | None,
        at_least_one: bool,
    ) -> Selection:
        if self.runs_model:
            self._loss(loss_fn)  # no loss function: fail now, whatever the progress
        if not self._checked:
            self.check(batch, model, loss_fn)
        inputs, target = split_batch(batch, self.input_key, self.target_key)
        n = batch_size(inputs, target)
        if self._stale is not None:  # checked on every batch, not only once the window opens
            self._stale.check_batch(indices, 0 if self.rule == "loss_rank" else epoch, n)
        st = self.stats
        st.batches += 1
        st.examples += n
        if not self.is_active(progress, batch_idx):
            st.backpropagated += n
            return Selection(batch, None, None)
        draw = (
            self._draws
        )  # counted on every active batch: the count follows the schedule, equal on all ranks
        self._draws += 1
        if self.rule in _FIXED_K and num_selected(n, self.keep) == n:
            st.backpropagated += n
            return Selection(batch, None, None)

        device = first_tensor(inputs).device  # type: ignore[union-attr]
        self._device = device
        t0 = 0.0
        if self.timing:
            self._sync()
            t0 = time.perf_counter()
        if self.rule == "loss_rank" and self._stale is not None and indices is not None:
            losses = self._stale.losses(indices).to(device, non_blocking=True)  # no forward pass
            st.reused += n
        elif self._stale is not None and indices is not None and epoch is not None:
            todo = (~self._stale.fresh(indices, epoch)).nonzero().squeeze(1)  # no device read for CPU indices
            n_todo = int(todo.shape[0])
            if n_todo:
                sub = index_batch(batch, todo.to(device, non_blocking=True), n) if n_todo < n else batch
                fresh_losses = self.score(model, sub, n_todo, loss_fn)
                self._stale.record(indices.index_select(0, todo), fresh_losses, epoch)
            losses = self._stale.losses(indices).to(device, non_blocking=True)
            st.forwarded += n_todo
            st.reused += n - n_todo
        else:
            losses = self.score(model, batch, n, loss_fn)
            st.forwarded += n

        if self.rule == "top":  # deterministic: no generator
            positions = select_hardest(losses, self.keep)
        elif self.rule == "loss_rank":
            pressure = pressure_at(progress, self.selection_pressure, self.final_pressure)
            positions = select_by_loss_rank(losses, self.keep, pressure, self._generator(losses.device, draw))
        elif self._history is None:
            positions = select_indices(losses, self.keep, self._generator(losses.device, draw))
        else:
            gen = self._generator(losses.device, draw)
            positions = self._history.sample(losses, gen, at_least_one=at_least_one).nonzero().squeeze(1)
        k = int(positions.shape[0])  # host metadata (the history rule's nonzero read the count)
        selected = index_batch(batch, positions, n)
        st.selected_batches += 1
        st.backpropagated += k
        st.skipped += n - k
        if self.timing:
            self._sync()
            st.selection_time_s += time.perf_counter() - t0
        return Selection(selected, positions, losses)

    def record_losses(self, indices: Tensor, losses: Tensor, epoch: int = 0) -> None:
        """Store losses measured elsewhere (e.g. the training step's) for ``indices``.

        For Stale-SB and for ``rule="loss_rank"``, whose ranking reads them (no need when the
        score table is InfoBatch's: its ``update`` stores the trained losses already).
        """
        if self._stale is None:
            raise ValueError("record_losses is for Stale-SB or rule='loss_rank': construct with one of them")
        self._stale.record(indices, losses, epoch)

    @property
    def score_table(self) -> ScoreTable | None:
        """Stale-SB's per-index losses (``None`` without Stale-SB)."""
        return None if self._stale is None else self._stale.table

    @property
    def history(self) -> LossHistory | None:
        """The history rule's ring buffer (``None`` for the rank rule)."""
        return self._history

    # ------------------------------------------------------------------ loader wrapper
    def iterate(
        self,
        loader: Iterable[Any],
        model: Any,
        loss_fn: Callable[..., Tensor] | None = None,
        *,
        epoch: int,
        num_epochs: int,
        batch_size: int | None = None,
        indices_key: Key | None = None,
        drop_last: bool = False,
    ) -> Iterator[Any]:
        """One epoch of ``loader`` with selection; selected rows accumulate into full batches.

        Batches where selection does not run pass through unchanged. Selected rows
        are collected until ``batch_size`` (default: the first loaded batch's size)
        are ready, so every optimiser step sees a full batch, as in the paper's
        code; the rest is yielded at the end of the epoch unless ``drop_last``.
        Within a selected batch the history rule may select nobody; nothing is
        forced in then. Progress is ``(epoch + i / len(loader)) / num_epochs``;
        ``indices_key`` is where each batch holds its dataset indices (Stale-SB).

        Example:
            >>> import torch, torch.nn.functional as F
            >>> data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(6)]
            >>> sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0)
            >>> [len(y) for x, y in sb.iterate(data, torch.nn.Linear(4, 3), F.cross_entropy, epoch=0, num_epochs=1)]
            [8, 8, 8]
        """
        return iterate_selected(
            self,
            loader,
            model,
            loss_fn,
            epoch=epoch,
            num_epochs=num_epochs,
            batch_size_out=batch_size,
            indices_key=indices_key,
            drop_last=drop_last,
        )

    # ------------------------------------------------------------------ timing
    @contextlib.contextmanager
    def step_timer(self) -> Iterator[None]:
        """Time a training step into ``stats.step_time_s`` (synchronises a CUDA device around it).

        Example:
            >>> import time
            >>> sb = SelectiveBackprop()
            >>> for _ in range(2):
            ...     with sb.step_timer():
            ...         time.sleep(0.01)
            >>> 0.02 <= sb.stats.step_time_s < 1.0  # both blocks, accumulated
            True
        """
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.stats.step_time_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Counters, the draw count, history, Stale-SB memory, the scorer's state (``weights_only``-safe).

        The random state is the number of draws made, identical on every rank, so
        a checkpoint saved by one rank resumes every rank's own draws exactly.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> a = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0, seed=3)
            >>> batch, model = (torch.randn(8, 4), torch.randint(0, 3, (8,))), torch.nn.Linear(4, 3)
            >>> _ = a.select(batch, model, F.cross_entropy, progress=0.6, batch_idx=0)
            >>> b = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0, seed=3)
            >>> b.load_state_dict(a.state_dict())
            >>> pa = a.select(batch, model, F.cross_entropy, progress=0.6, batch_idx=1).positions
            >>> pb = b.select(batch, model, F.cross_entropy, progress=0.6, batch_idx=1).positions
            >>> a.state_dict()["draws"], torch.equal(pa, pb)
            (2, True)
        """
        return {
            "stats": asdict(self.stats),
            "draws": self._draws,
            "scorer": self._scorer_state(),
            "history": None if self._history is None else self._history.state_dict(),
            "stale": None if self._stale is None else self._stale.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (same rule and Stale-SB setting; any rank's state)."""
        if (state["history"] is None) != (self._history is None):
            raise ValueError("state_dict was saved with a different rule")
        if (state["stale"] is None) != (self._stale is None):
            raise ValueError("state_dict was saved with a different staleness setting")
        self.stats = SelectionStats(**state["stats"])
        # a state from before per-draw seeding holds generator states instead: one draw per selected batch
        self._draws = int(state["draws"]) if "draws" in state else self.stats.selected_batches
        if self._history is not None:
            self._history.load_state_dict(state["history"])
        if self._stale is not None:
            self._stale.load_state_dict(state["stale"])
        load = getattr(self.scorer, "load_state_dict", None)
        if state.get("scorer") is not None and callable(load):
            load(state["scorer"])

    def _scorer_state(self) -> Any:
        get = getattr(self.scorer, "state_dict", None)
        return get() if callable(get) else None
