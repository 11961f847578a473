"""``SelectiveBackprop``: the schedule object a training loop calls once per batch.

Selection is active while ``start <= progress < end`` (fractions of training),
except on *interrupt* batches, which train on the whole batch. The interrupt rule
is Composer's code, exactly: batch ``batch_idx`` (0-based, counted within the
epoch) is a vanilla batch when ``(batch_idx + 1) % interrupt == 0``. So:

- ``interrupt=0``: never interrupted - every batch in the window is selected;
- ``interrupt=1``: every batch is vanilla - selection never runs;
- ``interrupt=2`` (default): selection and vanilla batches alternate
  (batches 0, 2, 4, ... selected; 1, 3, 5, ... vanilla);
- ``interrupt=n``: in each run of ``n`` batches, the first ``n - 1`` are
  selected and the ``n``-th is vanilla.

(Composer's README says ``interrupt=2`` "performs a standard training batch
after every two batches of Selective Backprop"; its code alternates.)

Two selection rules:

- ``rule="rank"`` (default; Composer's): keep ``max(1, int(keep * N))`` of each
  batch, drawn by loss rank - sync-free;
- ``rule="history"`` (the paper's): keep each example with probability
  ``cdf ** beta`` against a ring buffer of recent losses. Pair it with
  :meth:`SelectiveBackprop.iterate`, which accumulates selected examples into
  full-size batches as the paper's code does.

Stale-SB (``staleness > 1``) reuses per-index losses measured within the last
``staleness`` epochs and skips their selection forward pass.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from leanbatch.scores import ScoreTable
from leanbatch.selection._checks import check_autocast, check_fraction, check_int, check_interval
from leanbatch.selection.accumulate import BatchAccumulator
from leanbatch.selection.batches import first_tensor, index_batch, is_batch, slice_batch
from leanbatch.selection.history import LossHistory
from leanbatch.selection.rank import num_selected, select_indices
from leanbatch.selection.rng import DEFAULT_SEED, canonical_device
from leanbatch.selection.scoring import (
    PerExampleLoss,
    as_per_example_loss,
    check_downsample,
    compute_losses,
)
from leanbatch.selection.stale import StaleScores
from leanbatch.selection.stats import SelectionStats

__all__ = ["SelectiveBackprop", "Selection", "should_selective_backprop", "training_progress"]

Key = int | str


def should_selective_backprop(
    current_duration: float, batch_idx: int, start: float = 0.5, end: float = 0.9, interrupt: int = 2
) -> bool:
    """Whether selection runs on this batch (Composer's rule and signature).

    True when ``start <= current_duration < end`` and the batch is not an
    interrupt batch, i.e. ``interrupt == 0`` or ``(batch_idx + 1) % interrupt != 0``.

    Example:
        >>> [should_selective_backprop(0.6, i, interrupt=2) for i in range(4)]
        [True, False, True, False]
        >>> [should_selective_backprop(0.6, i, interrupt=3) for i in range(6)]
        [True, True, False, True, True, False]
        >>> should_selective_backprop(0.95, 0), should_selective_backprop(0.6, 1, interrupt=0)
        (False, True)
    """
    in_window = start <= current_duration < end
    return in_window and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)


def training_progress(
    *,
    epoch: int | None = None,
    num_epochs: int | None = None,
    batch_idx: int = 0,
    batches_per_epoch: int | None = None,
    step: int | None = None,
    total_steps: int | None = None,
) -> float:
    """Fraction of training done, from an epoch position or from a step count.

    ``(epoch + batch_idx / batches_per_epoch) / num_epochs`` (whole epochs only
    when ``batches_per_epoch`` is not given), or ``step / total_steps``.

    Example:
        >>> training_progress(epoch=5, num_epochs=10, batch_idx=50, batches_per_epoch=100)
        0.55
        >>> training_progress(step=300, total_steps=1000)
        0.3
    """
    if step is not None or total_steps is not None:
        if step is None or total_steps is None:
            raise TypeError("pass both step= and total_steps=")
        check_int(step, "step", 0)
        check_int(total_steps, "total_steps", 1)
        return step / total_steps
    if epoch is None or num_epochs is None:
        raise TypeError(
            "pass epoch= and num_epochs= (optionally batch_idx=, batches_per_epoch=), or step=/total_steps="
        )
    check_int(epoch, "epoch", 0)
    check_int(num_epochs, "num_epochs", 1)
    frac = 0.0
    if batches_per_epoch is not None:
        frac = check_int(batch_idx, "batch_idx", 0) / check_int(batches_per_epoch, "batches_per_epoch", 1)
    return (epoch + frac) / num_epochs


class Selection(NamedTuple):
    """What :meth:`SelectiveBackprop.select` returns; unpacks as a 3-tuple.

    Attributes:
        batch: the batch to train on, same structure as the input (tensor,
            tuple/list or dict); every per-example tensor is cut to the kept rows.
        positions: int64 positions of the kept rows in the input batch, ascending,
            on the losses' device - or ``None`` when the batch is returned unchanged
            (outside the window, an interrupt batch, or a one-example batch).
        losses: float32 selection losses of *every* input example, shape ``(N,)``
            (stale ones included under Stale-SB), or ``None`` when none were computed.

    Example:
        >>> import torch
        >>> sel = Selection((torch.zeros(2, 3), torch.tensor([4, 5])), torch.tensor([1, 3]), torch.rand(4))
        >>> (x, y), positions, losses = sel
        >>> x.shape, positions.tolist(), sel.losses.shape
        (torch.Size([2, 3]), [1, 3], torch.Size([4]))
    """

    batch: Any
    positions: Tensor | None
    losses: Tensor | None


class SelectiveBackprop:
    """Selective Backprop (Jiang et al. 2019) as a schedule object for any training loop.

    Args:
        start: progress (fraction of training) at which selection starts.
        end: progress at which it stops (``start <= progress < end`` is active).
        keep: fraction of each batch the rank rule keeps, in (0, 1]; ``keep=1``
            disables selection (as in Composer).
        scale_factor: in (0, 1]; the selection pass sees inputs downsampled by it
            (float 3-D to 5-D inputs only).
        interrupt: every ``interrupt``-th batch of an epoch trains on the whole
            batch; 0 = never (see the module docstring for the exact rule).
        rule: ``"rank"`` (Composer's rank rule) or ``"history"`` (the paper's
            ``cdf ** beta`` against recent losses; ``keep`` does not apply).
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
            uses ``leanbatch.selection.rng.DEFAULT_SEED``.
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
        timing: bool = False,
    ):
        self.start, self.end = check_interval(start, end)
        self.keep = check_fraction(keep, "keep")
        self.scale_factor = check_fraction(scale_factor, "scale_factor")
        self.interrupt = check_int(interrupt, "interrupt", 0)
        if self.interrupt == 1:
            warnings.warn(
                "interrupt=1 makes every batch a vanilla batch ((batch_idx + 1) % 1 == 0): selection never "
                "runs. Use interrupt=0 to select on every batch of the window.",
                stacklevel=2,
            )
        if rule not in ("rank", "history"):
            raise ValueError(f"rule must be 'rank' or 'history', got {rule!r}")
        self.rule = rule
        self._history = LossHistory(history_size, beta) if rule == "history" else None
        check_int(staleness, "staleness", 1)
        self._stale: StaleScores | None = None
        if staleness > 1:
            self._stale = StaleScores(num_samples, staleness, score_table)
        elif score_table is not None or num_samples is not None:
            raise ValueError("num_samples/score_table are for Stale-SB: also pass staleness >= 2")
        self.staleness = staleness
        self.loss_fn = loss_fn
        self._default_loss = None if loss_fn is None else as_per_example_loss(loss_fn, "loss_fn")
        if input_key is not None and not isinstance(input_key, (int, str, list, tuple)):
            raise TypeError(f"input_key must be an int, a str or a list of str, got {input_key!r}")
        if target_key is not None and not isinstance(target_key, (int, str)):
            raise TypeError(f"target_key must be an int or a str, got {target_key!r}")
        self.input_key, self.target_key = input_key, target_key
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable as forward_fn(model, inputs), got {forward_fn!r}")
        self.forward_fn = forward_fn
        self.chunk_size = None if chunk_size is None else check_int(chunk_size, "chunk_size", 1)
        self.autocast = check_autocast(autocast)
        if not isinstance(eval_mode, bool):
            raise TypeError(f"eval_mode must be a bool, got {eval_mode!r}")
        self.eval_mode = eval_mode
        self.seed = DEFAULT_SEED if seed is None else check_int(seed, "seed", 0)
        self.timing = bool(timing)
        self.stats = SelectionStats()
        self._generators: dict[torch.device, torch.Generator] = {}
        self._checked = False
        self._device: torch.device | None = None
        self._last_loss: tuple[Any, PerExampleLoss] | None = None

    def __repr__(self) -> str:
        return (
            f"SelectiveBackprop(start={self.start}, end={self.end}, keep={self.keep}, "
            f"scale_factor={self.scale_factor}, interrupt={self.interrupt}, rule={self.rule!r}, "
            f"staleness={self.staleness})"
        )

    # ------------------------------------------------------------------ schedule
    def is_active(self, progress: float, batch_idx: int) -> bool:
        """Whether :meth:`select` selects on this batch (window, interrupt, ``keep < 1``)."""
        if self.rule == "rank" and self.keep >= 1.0:
            return False
        return should_selective_backprop(progress, batch_idx, self.start, self.end, self.interrupt)

    # ------------------------------------------------------------------ batch layout
    def _split(self, batch: Any) -> tuple[Any, Any]:
        """(model inputs, target) of ``batch``."""
        if isinstance(batch, Tensor):
            return batch, batch
        if isinstance(batch, Mapping):
            tk = "labels" if self.target_key is None else self.target_key
            if tk not in batch:
                raise ValueError(
                    f"target_key {tk!r} is not a key of the batch {list(batch)}: pass target_key="
                )
            ik = self.input_key
            if ik is None:  # Hugging Face style: every tensor except the target, as keyword inputs
                return {k: v for k, v in batch.items() if k != tk and isinstance(v, Tensor)}, batch[tk]
            keys = list(ik) if isinstance(ik, (list, tuple)) else [ik]
            missing = [k for k in keys if k not in batch]
            if missing:
                raise ValueError(f"input_key {missing} not in the batch {list(batch)}: pass input_key=")
            inputs = {k: batch[k] for k in keys} if isinstance(ik, (list, tuple)) else batch[ik]
            return inputs, batch[tk]
        if is_batch(batch):
            ik = 0 if self.input_key is None else self.input_key
            tk = (1 if len(batch) > 1 else 0) if self.target_key is None else self.target_key
            for name, k in (("input_key", ik), ("target_key", tk)):
                if not isinstance(k, int) or not -len(batch) <= k < len(batch):
                    raise ValueError(f"{name}={k!r} does not index a batch of {len(batch)} elements")
            return batch[ik], batch[tk]  # type: ignore[index]
        raise TypeError(
            f"a batch must be a tensor, a tuple/list or a dict of tensors, got {type(batch).__name__}"
        )

    @staticmethod
    def _size(inputs: Any, target: Any) -> int:
        lead = first_tensor(inputs)
        if lead is None:
            raise ValueError("the model input holds no tensor with a batch dimension")
        n = int(lead.shape[0])
        if n < 1:
            raise ValueError("the batch holds no example")
        t = first_tensor(target)
        if t is None or t.shape[0] != n:
            shape = None if t is None else tuple(t.shape)
            raise ValueError(f"the target must hold one entry per example ({n}), got shape {shape}")
        return n

    def _loss(self, loss_fn: Callable[..., Tensor] | None) -> PerExampleLoss:
        if loss_fn is None:
            if self._default_loss is None:
                raise TypeError(
                    "no loss function: pass loss_fn to select() or to SelectiveBackprop(loss_fn=)"
                )
            return self._default_loss
        if self._last_loss is None or self._last_loss[0] is not loss_fn:  # checked once, not per step
            self._last_loss = (loss_fn, as_per_example_loss(loss_fn, "loss_fn"))
        return self._last_loss[1]

    def _score(self, model: Any, batch: Any, loss: PerExampleLoss, n: int, eval_mode: bool) -> Tensor:
        inputs, target = self._split(batch)
        return compute_losses(
            model,
            inputs,
            target,
            loss,
            n,
            scale_factor=self.scale_factor,
            chunk_size=self.chunk_size,
            autocast=self.autocast,
            eval_mode=eval_mode,
            forward=self.forward_fn,
        )

    def check(self, batch: Any, model: Any, loss_fn: Callable[..., Tensor] | None = None) -> None:
        """Dry-run the selection pass on (at most) two examples of ``batch``.

        Checks the batch layout, that downsampling applies to the input, that the
        model accepts the downsampled input and that the loss returns one value per
        example. Runs in eval mode under ``no_grad``; the model is left as it was.
        :meth:`select` calls it on its first batch, whatever the progress.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> sb = SelectiveBackprop()  # scale_factor=0.5 needs image-like inputs
            >>> flat_batch = (torch.randn(4, 8), torch.zeros(4, dtype=torch.long))
            >>> try:
            ...     sb.check(flat_batch, torch.nn.Linear(8, 2), F.cross_entropy)
            ... except ValueError as e:
            ...     print(str(e).split(",")[0])
            scale_factor=0.5 < 1 downsamples the model input spatially
        """
        loss = self._loss(loss_fn)
        inputs, target = self._split(batch)
        n = self._size(inputs, target)
        check_downsample(inputs, self.scale_factor)
        m = min(n, 2)
        compute_losses(
            model,
            slice_batch(inputs, 0, m, n),
            slice_batch(target, 0, m, n),
            loss,
            m,
            scale_factor=self.scale_factor,
            autocast=self.autocast,
            eval_mode=isinstance(model, nn.Module),
            forward=self.forward_fn,
        )
        self._checked = True

    # ------------------------------------------------------------------ selection
    def _generator(self, device: torch.device) -> torch.Generator:
        dev = canonical_device(device)
        gen = self._generators.get(dev)
        if gen is None:
            gen = self._generators[dev] = torch.Generator(device=dev)
            gen.manual_seed(self.seed)
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
        loss = self._loss(loss_fn)
        if not self._checked:
            self.check(batch, model, loss_fn)
        inputs, target = self._split(batch)
        n = self._size(inputs, target)
        if self._stale is not None:  # checked on every batch, not only once the window opens
            if indices is None or epoch is None:
                raise ValueError(
                    "Stale-SB (staleness >= 2) needs select(..., indices=dataset_indices, epoch=epoch)"
                )
            if not isinstance(indices, Tensor) or tuple(indices.shape) != (n,):
                shape = tuple(indices.shape) if isinstance(indices, Tensor) else type(indices).__name__
                raise ValueError(f"indices must be a tensor of shape ({n},) (one per example), got {shape}")
        st = self.stats
        st.batches += 1
        st.examples += n
        if not self.is_active(progress, batch_idx) or (
            self.rule == "rank" and num_selected(n, self.keep) == n
        ):
            st.backpropagated += n
            return Selection(batch, None, None)

        device = first_tensor(inputs).device  # type: ignore[union-attr]
        self._device = device
        t0 = 0.0
        if self.timing:
            self._sync()
            t0 = time.perf_counter()
        eval_mode = self.eval_mode
        if self._stale is not None and indices is not None and epoch is not None:
            todo = (~self._stale.fresh(indices, epoch)).nonzero().squeeze(1)  # no device read for CPU indices
            n_todo = int(todo.shape[0])
            if n_todo:
                sub = index_batch(batch, todo.to(device, non_blocking=True), n) if n_todo < n else batch
                fresh_losses = self._score(model, sub, loss, n_todo, eval_mode)
                self._stale.record(indices.index_select(0, todo), fresh_losses, epoch)
            losses = self._stale.losses(indices).to(device, non_blocking=True)
            st.forwarded += n_todo
            st.reused += n - n_todo
        else:
            losses = self._score(model, batch, loss, n, eval_mode)
            st.forwarded += n

        gen = self._generator(losses.device)
        if self._history is None:
            positions = select_indices(losses, self.keep, gen)
        else:
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

    def record_losses(self, indices: Tensor, losses: Tensor, epoch: int) -> None:
        """Stale-SB: store losses measured elsewhere (e.g. the training step's) for ``indices``."""
        if self._stale is None:
            raise ValueError("record_losses is for Stale-SB: construct with staleness >= 2")
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
        forced in then. Progress is ``(epoch + i / len(loader)) / num_epochs``.

        Args:
            loader: an iterable of batches (a ``DataLoader``).
            model, loss_fn: as in :meth:`select`.
            epoch: the epoch being run (0-based).
            num_epochs: epochs in the whole run.
            batch_size: size of the batches handed out.
            indices_key: where each batch holds its dataset indices (Stale-SB).
            drop_last: drop the last, smaller accumulated batch.

        Example:
            >>> import torch, torch.nn.functional as F
            >>> data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(6)]
            >>> sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0)
            >>> sizes = [len(y) for x, y in sb.iterate(data, torch.nn.Linear(4, 3), F.cross_entropy,
            ...                                         epoch=0, num_epochs=1)]
            >>> sizes
            [8, 8, 8]
        """
        check_int(epoch, "epoch", 0)
        check_int(num_epochs, "num_epochs", 1)
        try:
            per_epoch: int | None = len(loader)  # type: ignore[arg-type]
        except TypeError:
            per_epoch = None
        acc: BatchAccumulator | None = None if batch_size is None else BatchAccumulator(batch_size)
        for i, batch in enumerate(loader):
            progress = training_progress(
                epoch=epoch, num_epochs=num_epochs, batch_idx=i, batches_per_epoch=per_epoch
            )
            idx = None if indices_key is None else batch[indices_key]
            # the history rule may keep nobody here: the accumulator never hands out an empty batch
            sel = self._select(batch, model, loss_fn, progress, i, idx, epoch, at_least_one=False)
            if sel.positions is None:
                yield sel.batch
                continue
            if acc is None:
                inputs, target = self._split(batch)
                acc = BatchAccumulator(self._size(inputs, target))
            acc.add(sel.batch, int(sel.positions.shape[0]))
            while (full := acc.pop()) is not None:
                yield full
        if acc is not None:
            if drop_last:
                dropped = acc.pending
                self.stats.backpropagated -= dropped
                self.stats.skipped += dropped
            else:
                rest = acc.flush()
                if rest is not None:
                    yield rest

    # ------------------------------------------------------------------ timing
    @contextlib.contextmanager
    def step_timer(self) -> Iterator[None]:
        """Time a training step into ``stats.step_time_s`` (synchronises a CUDA device around it).

        Example:
            >>> sb = SelectiveBackprop()
            >>> with sb.step_timer():
            ...     pass
            >>> sb.stats.step_time_s >= 0.0
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
        """Counters, generator states, history and Stale-SB memory (``torch.load(weights_only=True)``-safe)."""
        return {
            "stats": asdict(self.stats),
            "generators": {str(d): g.get_state() for d, g in self._generators.items()},
            "history": None if self._history is None else self._history.state_dict(),
            "stale": None if self._stale is None else self._stale.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (same rule and Stale-SB setting)."""
        self.stats = SelectionStats(**state["stats"])
        for dev, gen_state in state["generators"].items():
            self._generator(torch.device(dev)).set_state(gen_state)
        if (state["history"] is None) != (self._history is None):
            raise ValueError("state_dict was saved with a different rule")
        if self._history is not None:
            self._history.load_state_dict(state["history"])
        if (state["stale"] is None) != (self._stale is None):
            raise ValueError("state_dict was saved with a different staleness setting")
        if self._stale is not None:
            self._stale.load_state_dict(state["stale"])
