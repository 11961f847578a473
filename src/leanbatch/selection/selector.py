"""The composed selector: a schedule x a source of scores x a rule.

:class:`Selector` holds one of each part and does what every method shares: per-batch checks,
counters (:class:`~leanbatch.selection.SelectionStats`), per-draw seeding, timing, the loader
wrapper and the state. The ``t``-th active batch draws from a private generator reseeded from
``mix_seed(seed, rank, t)`` (:class:`leanbatch.rng.Generators`), so ranks draw independently and
the random state to resume is one integer, the same on every rank. With ``scope="global"`` the
ranks of a process group choose together over the whole step's batch
(:mod:`~leanbatch.selection.scope`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from leanbatch.checks import check_bool, check_int, require
from leanbatch.progress import training_progress
from leanbatch.rng import Generators
from leanbatch.scores import ScoreTable
from leanbatch.selection.batches import BatchAccumulator, index_batch
from leanbatch.selection.layout import Key, Keys, Rows, Selection, read_rows
from leanbatch.selection.rules import Draw, Rule
from leanbatch.selection.schedule import Scheduled, Window, check_progress
from leanbatch.selection.scope import Scope
from leanbatch.selection.sources import Source
from leanbatch.selection.stats import SelectionStats

if TYPE_CHECKING:  # the history rule's buffer, for the type of Selector.history only
    from leanbatch.selection.history import LossHistory


class Selector(Scheduled):
    """Batch-level selection composed of a schedule, a source of scores and a rule.

    ``source`` is ``None`` for a rule that reads no scores (uniform). ``keys``: ``(input_key,
    target_key)`` of the batch layout, or ``None`` when no model input is needed (every
    per-example tensor is a row). ``seed``, ``rank``, ``group``: the private
    :class:`~leanbatch.rng.Generators`. ``timing``: measure selection time (syncs a CUDA device).
    ``scope``: ``"local"`` selects within each rank's batch, ``"global"`` over the whole step's
    rows of ``group`` (default: the world; :mod:`~leanbatch.selection.scope`, :meth:`step_loss`).

    Example:
        >>> import torch
        >>> from leanbatch.selection.rules import UniformRule
        >>> sel = Selector(Window(0.0, 1.0, interrupt=0), None, UniformRule(0.5), seed=0)
        >>> (x, y), positions, losses = sel.select((torch.randn(8, 3), torch.arange(8)), progress=0.5, batch_idx=0)
        >>> x.shape[0], torch.equal(y, positions), losses is None
        (4, True, True)
    """

    def __init__(
        self,
        schedule: Window,
        source: Source | None,
        rule: Rule,
        *,
        keys: Keys | None = (None, None),
        seed: int | None = None,
        rank: int | None = None,
        group: Any = None,
        timing: bool = False,
        scope: str = "local",
    ):
        if rule.needs_scores != (source is not None):
            need = "needs a source of scores" if rule.needs_scores else "reads no scores: pass source=None"
            raise ValueError(f"rule {rule.name!r} {need}")
        self.schedule, self.source, self.selection_rule, self.keys = schedule, source, rule, keys
        self.generators = Generators(seed, rank, group)
        self.selection_scope = Scope(scope, group)
        self.timing = check_bool(timing, "timing")
        self.stats = SelectionStats()
        self._draws = 0  # active batches so far: the draw number, the same on every rank
        self._checked = False
        self._device: torch.device | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.schedule}, {type(self.source).__name__}, rule={self.selection_rule.name!r})"

    @property
    def scope(self) -> str:
        """``"local"`` or ``"global"``: where one choice is made (:mod:`~leanbatch.selection.scope`)."""
        return self.selection_scope.name

    @property
    def interrupt(self) -> int:
        """Every ``interrupt``-th batch of an epoch trains in full (0: never)."""
        return self.schedule.interrupt

    @property
    def keep(self) -> float | None:
        """The share of each batch a fixed-count rule keeps (``None`` for the history rule)."""
        return self.selection_rule.keep

    @property
    def runs_model(self) -> bool:
        """Whether selection runs the model being trained (then it needs a loss function)."""
        return self.source is not None and self.source.runs_model

    @property
    def score_table(self) -> ScoreTable | None:
        """The per-index memory of losses (``None`` without one)."""
        return None if self.source is None else self.source.table

    @property
    def history(self) -> LossHistory | None:
        """The history rule's ring buffer (``None`` for other rules)."""
        return getattr(self.selection_rule, "history", None)

    def is_active(self, progress: float, batch_idx: int) -> bool:
        """Whether :meth:`select` selects on this batch (window, interrupt, and ``keep < 1``).

        Example:
            >>> from leanbatch.selection.rules import UniformRule
            >>> sel = Selector(Window(0.5, 0.9, interrupt=3), None, UniformRule(0.5))
            >>> [sel.is_active(0.6, i) for i in range(4)], sel.is_active(0.9, 0)
            ([True, True, False, True], False)
        """
        keep = self.selection_rule.keep
        return (keep is None or keep < 1.0) and self.schedule.is_active(progress, batch_idx)

    def check(self, batch: Any, model: Any = None, loss_fn: Callable[..., Tensor] | None = None) -> None:
        """Check the batch layout and dry-run the source on two examples (model left as it was).

        :meth:`select` calls it on its first batch, whatever the progress.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> from leanbatch import SelectiveBackprop
            >>> sb = SelectiveBackprop()  # scale_factor=0.5 needs image-like inputs
            >>> try:
            ...     sb.check((torch.randn(4, 8), torch.zeros(4, dtype=torch.long)), torch.nn.Linear(8, 2), F.cross_entropy)
            ... except ValueError as e:
            ...     print(str(e).split(",")[0])
            scale_factor=0.5 < 1 downsamples the model input spatially
        """
        rows = read_rows(batch, self.keys)
        if self.source is not None:
            self.source.check(rows, model, loss_fn)
        self._checked = True

    def select(
        self,
        batch: Any,
        model: Any = None,
        loss_fn: Callable[..., Tensor] | None = None,
        progress: float | None = None,
        batch_idx: int | None = None,
        *,
        indices: Tensor | None = None,
        epoch: int | None = None,
    ) -> Selection:
        """Select the rows of ``batch`` to train on; returns ``Selection(batch, positions, losses)``.

        ``batch``: a tensor, tuple/list or dict of tensors; ``model``, ``loss_fn``
        (``loss_fn(output, target, reduction="none")``, default the constructor's): for a source
        that runs the model (left in its mode, BN statistics kept); ``progress``: fraction of
        training done, in [0, 1] (:func:`leanbatch.training_progress`); ``batch_idx``: the batch's index in
        its epoch; ``indices``: the rows' dataset indices, on the CPU (a memory of losses);
        ``epoch`` (Stale-SB). In the loop: select, then batch-level augmentation, then train.

        Example:
            >>> import torch
            >>> from leanbatch.selection.rules import UniformRule
            >>> sel = Selector(Window(0.5, 0.9), None, UniformRule(0.25))
            >>> sel.select(torch.zeros(8, 2), progress=0.1, batch_idx=0).positions is None  # before the window
            True
        """
        if not (  # the usual call, a float and an int in range, needs no further check
            type(progress) is float and type(batch_idx) is int and 0.0 <= progress <= 1.0 and batch_idx >= 0
        ):
            if progress is None or batch_idx is None:
                raise TypeError("select() needs progress= (fraction of training done) and batch_idx=")
            progress, batch_idx = check_progress(progress), check_int(batch_idx, "batch_idx", 0)
        rows = read_rows(batch, self.keys, indices, epoch)
        return self._select(batch, rows, model, loss_fn, progress, batch_idx, True)

    def _select(
        self,
        batch: Any,
        rows: Rows,
        model: Any,
        loss_fn: Callable[..., Tensor] | None,
        progress: float,
        batch_idx: int,
        at_least_one: bool,
    ) -> Selection:
        if self.source is not None:
            self.source.check_batch(rows, loss_fn)  # on every batch, not only once the window opens
        if not self._checked:
            self.check(batch, model, loss_fn)
        n, st, rule, w = rows.n, self.stats, self.selection_rule, self.selection_scope.world
        st.batches += 1
        st.examples += n
        self.selection_scope.returned(n)
        active = self.is_active(progress, batch_idx)
        draw = self._draws  # counted on every active batch: it follows the schedule, equal on all ranks
        self._draws += int(active)
        if not active or rule.num_kept(w * n) == w * n:
            st.backpropagated += n
            return Selection(batch, None, None)
        self._device = rows.device
        if self.timing:
            self._sync()
        t0 = time.perf_counter()
        scores = None if self.source is None else self.source.scores(rows, model, loss_fn, st)
        device = rows.device if scores is None else scores.device
        positions, chosen = self.selection_scope.choose(
            rule, scores, Draw(n, device, None, progress, at_least_one), self.generators, draw
        )
        k = int(positions.shape[0])  # host metadata (a varying count was read)
        selected = index_batch(batch, positions, n)
        st.selected_batches += 1
        st.backpropagated += k
        st.filled += k - chosen
        st.skipped += n - k
        if self.timing:
            self._sync()
            st.selection_time_s += time.perf_counter() - t0
        return Selection(selected, positions, scores)

    def step_loss(self, losses: Tensor) -> Tensor:
        """The loss to backpropagate from the per-row losses of the batch last returned: their
        mean; under global selection ``losses.sum() * W / K`` (:meth:`Scope.step_loss`).

        Example:
            >>> import torch
            >>> from leanbatch.selection.rules import UniformRule
            >>> sel = Selector(Window(0.0, 1.0, interrupt=0), None, UniformRule(0.5), scope="global")
            >>> (x, _), _, _ = sel.select((torch.randn(8, 3), torch.arange(8)), progress=0.5, batch_idx=0)
            >>> float(sel.step_loss(torch.tensor([1.0, 2.0, 3.0, 6.0])))  # one process: the mean
            3.0
        """
        return self.selection_scope.step_loss(losses)

    def record_losses(self, indices: Tensor, losses: Tensor, epoch: int = 0) -> None:
        """Store the trained losses of ``indices`` in the memory the ranking reads (not needed
        when it is InfoBatch's table); ``epoch``: when measured (Stale-SB; a memory of last losses
        keeps no epochs).
        """
        if self.source is None:
            raise ValueError("record_losses is for a memory of losses: this selector reads no scores")
        self.source.record(indices, losses, epoch)

    def iterate(
        self,
        loader: Iterable[Any],
        model: Any = None,
        loss_fn: Callable[..., Tensor] | None = None,
        *,
        epoch: int,
        num_epochs: int,
        batch_size: int | None = None,
        indices_key: Key | None = None,
        drop_last: bool = False,
    ) -> Iterator[Any]:
        """One epoch of ``loader`` with selection; selected rows accumulate into full batches.

        Batches where selection does not run pass through; selected rows are collected into
        batches of ``batch_size`` (default: the loaded size), as in the paper's code, the rest
        yielded at the end unless ``drop_last``; the history rule may keep nobody of a batch.
        Under global selection (ranks keep varying counts: accumulating would desynchronise DDP)
        each selected batch is yielded as is, no ``batch_size``; one the group keeps none of by none.
        Progress is ``(epoch + i / len(loader)) / num_epochs``; ``indices_key``: where each batch
        holds its dataset indices.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> from leanbatch import SelectiveBackprop
            >>> data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
            >>> sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.25, scale_factor=1.0, interrupt=2)
            >>> [len(y) for x, y in sb.iterate(data, torch.nn.Linear(4, 3), F.cross_entropy, epoch=0, num_epochs=1)]
            [8, 8, 4]
        """
        check_int(epoch, "epoch", 0)
        check_int(num_epochs, "num_epochs", 1)
        try:
            per_epoch: int | None = len(loader)  # type: ignore[arg-type]
        except TypeError:
            per_epoch = None
        whole = self.selection_scope.world > 1  # global selection: no accumulation
        if whole and batch_size is not None:
            raise ValueError("scope='global' yields each selected batch as selected: drop batch_size")
        acc = None if batch_size is None else BatchAccumulator(batch_size)
        for i, batch in enumerate(loader):
            progress = training_progress(
                epoch=epoch, num_epochs=num_epochs, batch_idx=i, batches_per_epoch=per_epoch
            )
            rows = read_rows(batch, self.keys, None if indices_key is None else batch[indices_key], epoch)
            sel = self._select(batch, rows, model, loss_fn, progress, i, False)  # may keep nobody
            if sel.positions is None or (whole and sel.positions.shape[0] > 0):
                yield sel.batch
            if sel.positions is None or whole:
                continue
            if acc is None:
                acc = BatchAccumulator(rows.n)
            acc.add(sel.batch, int(sel.positions.shape[0]))
            while (full := acc.pop()) is not None:
                yield full
        if acc is not None and drop_last:
            self.stats.backpropagated -= acc.pending
            self.stats.skipped += acc.pending
        elif acc is not None and (rest := acc.flush()) is not None:
            yield rest

    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    @contextlib.contextmanager
    def step_timer(self) -> Iterator[None]:
        """Time a training step into ``stats.step_time_s`` (synchronises a CUDA device around it).

        Example:
            >>> import time
            >>> from leanbatch import SelectiveBackprop
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

    def state_dict(self) -> dict[str, Any]:
        """Counters, the draw count (the same on every rank: any rank's checkpoint resumes every
        rank's own draws) and the parts' state; loads with ``torch.load(weights_only=True)``.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> from leanbatch import SelectiveBackprop
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
        state: dict[str, Any] = {"stats": asdict(self.stats), "draws": self._draws}
        state.update(scorer=None, history=None, memory=None)
        for part in (self.source, self.selection_rule):
            if part is not None:
                state.update(part.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (same parts; any rank's state)."""
        require(state, ("stats", "draws", "scorer", "history", "memory"), f"{type(self).__name__} state_dict")
        if (state["history"] is None) != (self.history is None):
            raise ValueError("state_dict was saved with a different rule")
        if (state["memory"] is None) != (self.score_table is None):
            raise ValueError(
                "state_dict was saved with a different memory setting (staleness, rule='loss_rank')"
            )
        self.stats = SelectionStats(**state["stats"])
        self._draws = int(state["draws"])
        for part in (self.source, self.selection_rule):
            if part is not None:
                part.load_state_dict(state)
