"""``LeanbatchMixin``: the Trainer overrides that wire in the core (``LeanBatchTrainer`` is it over
``Trainer``). What each Trainer and accelerate behaviour needs, and how it is met: the package
docstring (:mod:`leanbatch.hf`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import Sampler
from transformers import Trainer, TrainerCallback

from leanbatch.checks import check_bool
from leanbatch.distributed import ScoreCarrier, carry_if_ddp
from leanbatch.hf.checks import check_setup, wrap_train_dataset
from leanbatch.hf.data import INDEX_KEY, IndexCollator, IndexedDataset, Rows
from leanbatch.hf.losses import weighted_loss
from leanbatch.hf.packed import Packing, is_packed, packed_losses, packing_of, token_weights
from leanbatch.hf.state import load_state, save_state
from leanbatch.infobatch import InfoBatch
from leanbatch.losses import sequence_losses, token_losses
from leanbatch.policies.plan import Plan
from leanbatch.selection.selective_backprop import SelectiveBackprop

__all__ = ["STATE_FILE", "LeanbatchMixin"]

STATE_FILE = "leanbatch_state.pt"
"""The file in each checkpoint folder that holds the pruning and selection state."""

_NEEDED = (
    "_run_epoch",
    "_get_num_items_in_batch",
    "_get_dataloader",
    "_set_signature_columns_if_needed",
    "_load_optimizer_and_scheduler",
    "_save_checkpoint",
    "_get_output_dir",
)
if any(not hasattr(Trainer, name) for name in _NEEDED):  # pragma: no cover - older transformers
    raise ImportError(
        "leanbatch.hf needs transformers>=5.24 (its Trainer lacks "
        f"{[n for n in _NEEDED if not hasattr(Trainer, n)]}): pip install 'leanbatch[transformers]'"
    )
_RUN_EPOCH = inspect.signature(Trainer._run_epoch)

_Base: Any = Trainer if TYPE_CHECKING else object


class _PlanSampler(Sampler[int]):
    """InfoBatch's sampler as the Trainer sees it: the global plan, and no ``set_epoch``.

    Epochs advance inside the core (an epoch ends when it has been trained); the Trainer's
    and accelerate's own epoch numbers, wrong after a resume, never reach the plan.
    """

    def __init__(self, infobatch: InfoBatch):
        self.infobatch = infobatch

    def __iter__(self) -> Iterator[int]:
        return iter(self.infobatch.sampler)

    def __len__(self) -> int:
        return len(self.infobatch.sampler)


class _Step(NamedTuple):
    """The micro-batch being trained: its rows, plan, first global position, packing, ``shift_labels``."""

    rows: Rows
    plan: Plan
    first: int
    packing: Packing | None
    shift_labels: Tensor | None


class _EpochCallback(TrainerCallback):
    """Sets ``state.epoch`` from what InfoBatch has trained (the Trainer counts full-length epochs)."""

    def __init__(self, infobatch: InfoBatch):
        self.infobatch = infobatch

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        pos = self.infobatch.position
        state.epoch = pos.epoch + pos.fraction

    on_epoch_end = on_step_end


def _by_progress(f: Callable[..., float], ds: InfoBatch, total: int) -> Callable[[int], float]:
    """The schedule ``f`` evaluated at ``ds.progress * total``, not at the optimizer step (a function:
    ``LambdaLR.state_dict`` does not save it)."""
    return lambda _step: f(ds.progress * total)


class LeanbatchMixin(_Base):
    """The overrides; combine with any ``Trainer`` class through :func:`leanbatch.hf.leanbatch_trainer`."""

    def __init__(
        self,
        *args: Any,
        infobatch: Mapping[str, Any] | None = None,
        selective_backprop: SelectiveBackprop | None = None,
        carry_scores: bool = False,
        **kwargs: Any,
    ):
        check_bool(carry_scores, "carry_scores")
        super().__init__(*args, **kwargs)
        if infobatch is not None:  # around the dataset as the trainer prepared it (trl tokenizes in __init__)
            wrapped: Any = wrap_train_dataset(self, infobatch)
            self.train_dataset = wrapped
        ds = self.train_dataset if isinstance(self.train_dataset, InfoBatch) else None
        check_setup(self, ds, selective_backprop)
        self.infobatch: InfoBatch | None = ds
        self.selective_backprop: SelectiveBackprop | None = selective_backprop
        self._lb_step: _Step | None = None  # the micro-batch being trained
        self._lb_round = 0  # samples the processes train together per micro-batch
        self._lb_first_epoch: int | None = None
        self._lb_updates_per_epoch = 1
        self._lb_carry = carry_scores
        self._lb_carried: Any = None  # the wrapped model the carrier was tried on
        self.score_carrier: ScoreCarrier | None = None  # with carry_scores under DDP: the scores' carrier
        if ds is not None:
            loss_fn: Any = self._leanbatch_loss
            collator: Any = IndexCollator(cast(Any, self).data_collator, shift=self._loss_shifts_labels)
            self.compute_loss_func, self.data_collator = loss_fn, collator
            self.callback_handler.callbacks.insert(0, _EpochCallback(ds))

    # ------------------------------------------------------------------ data
    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if self.infobatch is not None and INDEX_KEY not in self._signature_columns:
            self._signature_columns.append(INDEX_KEY)  # survives remove_unused_columns

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler | None:
        if self.infobatch is None:
            return super()._get_train_sampler(train_dataset)
        return _PlanSampler(self.infobatch)

    def get_train_dataloader(self) -> Any:
        ds = self.infobatch
        if ds is None:
            return super().get_train_dataloader()
        if self.train_dataset is not ds:
            raise ValueError(
                "trainer.train_dataset is no longer the InfoBatch the trainer was built with: build a new "
                "trainer with train_dataset=InfoBatch(...)"
            )
        self._lb_first_epoch = None  # a new train() call
        loader = self._get_dataloader(
            dataset=IndexedDataset(ds.dataset),
            description="Training",
            batch_size=self._train_batch_size,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )
        total = getattr(loader, "total_batch_size", None)
        self._lb_round = int(total) if total else self._train_batch_size * self.accelerator.num_processes
        # Several processes: whole rounds of their batches, so accelerate never pads the last round
        # itself (from the start of its current pass, which after a mid-epoch resume is not the
        # epoch's start). One process trains a short last batch as it is.
        several = self.accelerator.num_processes > 1
        ds.sampler.set_round(self._lb_round if several else 1, drop_last=self.args.dataloader_drop_last)
        return loader

    # ------------------------------------------------------------------ epochs
    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        bound = _RUN_EPOCH.bind(self, *args, **kwargs)
        a = bound.arguments
        self._lb_updates_per_epoch = max(1, int(a["num_update_steps_per_epoch"]))
        ds = self.infobatch
        if ds is None:
            return super()._run_epoch(*args, **kwargs)
        epoch = ds.epoch
        if epoch >= ds.num_epochs:  # everything trained: the Trainer's epoch count ran long (a resume)
            self.control.should_training_stop = True
            return None
        ds.set_epoch(epoch)  # served next (a resumed position kept), so len() is its length
        steps = len(a["train_dataloader"])  # plans the epoch now, on every process at once
        ga = self.args.gradient_accumulation_steps
        if self._lb_first_epoch is None:
            self._lb_first_epoch = epoch
        a.update(
            epoch=epoch,
            steps_in_epoch=steps,
            num_update_steps_per_epoch=max(1, -(-steps // ga)),
            epochs_trained=self._lb_first_epoch,  # restores the RNG state once, in the resumed epoch
            steps_trained_in_current_epoch=0,  # the sampler resumes where training stopped: skip nothing
        )
        out = super()._run_epoch(*bound.args[1:], **bound.kwargs)
        if not self.control.should_training_stop and ds.epoch == epoch:
            ds.set_epoch(epoch + 1)  # dataloader_drop_last left a remainder, or a callback ended the epoch
        return out

    # ------------------------------------------------------------------ steps
    def get_batch_samples(
        self, epoch_iterator: Iterator[Any], num_batches: int, device: Any
    ) -> tuple[list, Any]:
        sb = self.selective_backprop
        if sb is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches = list(islice(epoch_iterator, num_batches))
        if batches:
            progress, first = self._lb_position()
            self.model.train()  # the selection pass sees the model as the training pass will
            batches = [self._lb_select(sb, b, progress, first + i) for i, b in enumerate(batches)]
        return batches, self._get_num_items_in_batch(batches, device)

    def _lb_position(self) -> tuple[float, int]:
        """(progress, index in its epoch of the next micro-batch), equal on every process."""
        ds, step = self.infobatch, self.state.global_step
        if ds is None:
            batch = step % self._lb_updates_per_epoch * self.args.gradient_accumulation_steps
            return step / max(1, self.state.max_steps), batch
        return ds.progress, ds.position.trained // max(1, self._lb_round)

    def _lb_selection_loss(self, logits: Tensor, labels: Tensor, reduction: str = "none") -> Tensor:
        """Selective Backprop's per-sequence loss (:mod:`leanbatch.losses`: 0 without a labelled token)."""
        return sequence_losses(*token_losses(logits, labels, self._loss_shifts_labels))

    def _lb_select(self, sb: SelectiveBackprop, batch: Any, progress: float, batch_idx: int) -> Any:
        rows = batch.get(INDEX_KEY) if isinstance(batch, Mapping) else None
        inputs = {k: v for k, v in batch.items() if k != INDEX_KEY} if rows is not None else batch
        if isinstance(inputs, Mapping) and is_packed(inputs):
            raise ValueError(
                "selective_backprop: the collator packs several sequences into one row (position_ids or "
                "cu_seq_lens_q, no attention_mask), and a packed row cannot skip the backward of one of its "
                "sequences; pad the batches (a collator that returns an attention_mask) or drop selective_backprop"
            )
        sel = sb.select(inputs, self.model, self._lb_selection_loss, progress=progress, batch_idx=batch_idx)
        if sel.positions is None:
            return batch
        out = sel.batch
        if isinstance(rows, Rows):
            out[INDEX_KEY] = Rows(rows.indices, rows.labelled, sel.positions, rows.sequences)
        return out

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Tensor:
        ds = self.infobatch
        if ds is None:
            return super().training_step(model, inputs, num_items_in_batch)
        rows = inputs.get(INDEX_KEY) if isinstance(inputs, Mapping) else None
        if not isinstance(rows, Rows):
            raise RuntimeError(
                f"a training batch arrived without its dataset indices (batch key {INDEX_KEY!r}): train with "
                "the trainer's own train dataloader and a collator that returns a dict"
            )
        shift_labels = inputs.get("shift_labels")  # a collator's shifted labels: the loss uses them
        inputs = {k: v for k, v in inputs.items() if k not in (INDEX_KEY, "shift_labels")}  # not the model's
        packing = None  # Selective Backprop's picked rows (positions) are never packed: refused when picked
        if rows.sequences is not None and rows.positions is None:
            packing = packing_of(inputs, rows.sequences)
        if packing is not None:
            inputs["use_cache"] = False  # a cache hides the packed sequences from sdpa and eager attention
        if self._lb_carry and self._lb_carried is not model:  # the scores ride DDP's all-reduce
            self._lb_carried, self.score_carrier = model, carry_if_ddp(ds, model)
        n, first = self._lb_trained(ds, len(rows))
        step = ds.sampler.prepare(n)
        self._lb_step = _Step(rows, step.plan, first, packing, shift_labels)
        try:
            out = super().training_step(model, inputs, num_items_in_batch)
            if self._lb_step is not None:  # the loss function never ran: nothing scored or weighted
                raise RuntimeError(
                    f"{type(self).__name__}.compute_loss did not go through leanbatch's loss, so no sample "
                    "was scored or weighted and InfoBatch would silently keep everything: call "
                    "super().compute_loss(model, inputs, return_outputs, num_items_in_batch) from your "
                    "compute_loss, or compute the loss with self.compute_loss_func(outputs, labels, "
                    "num_items_in_batch=num_items_in_batch)"
                )
        finally:
            self._lb_step = None
        ds.sampler.commit(step, gathered=True)  # every process stored every process's scores
        return out

    def _lb_trained(self, ds: InfoBatch, local: int) -> tuple[int, int]:
        """Samples this micro-batch trains across all processes (a global batch, less at the epoch's
        end), and the global position of this process's first row."""
        left = ds.sampler.left()
        if not left:
            raise RuntimeError("the InfoBatch sampler is not being iterated: train with trainer.train()")
        n = min(self._lb_round or local, left)
        if self.accelerator.num_processes == 1 and n != local:
            raise RuntimeError(
                f"a batch of {local} samples arrived where the sampler's ledger expects {n}: was the "
                "train dataloader's batch sampler replaced?"
            )
        return n, ds.position.trained + self.accelerator.process_index * local

    def _leanbatch_loss(self, outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Tensor:
        """The ``compute_loss_func``: token losses, scores stored, sequences weighted, normalised."""
        logits = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits", None)
        if logits is None:
            raise TypeError("leanbatch.hf needs a model whose output has .logits")
        step, self._lb_step = self._lb_step, None  # scored once: the training step checks it was
        shift = self._loss_shifts_labels
        if step is not None and step.shift_labels is not None:
            labels, shift = step.shift_labels, False
        if labels is None:
            raise ValueError("leanbatch.hf needs labels in every training batch (batch key 'labels')")
        tok, counted = token_losses(logits, labels, shift)
        if step is None:
            return weighted_loss(tok, counted, None, num_items_in_batch)
        if step.packing is None:
            rows_counted = counted if step.rows.positions is None else None  # what the loss reads counts
            weights = self._lb_score(step, sequence_losses(tok.detach(), counted), rows_counted)
            return weighted_loss(tok, counted, weights, num_items_in_batch)
        ids, losses, per_sample = packed_losses(tok.detach(), labels, step.packing, shift)
        weights = self._lb_score(step, losses, per_sample)
        return weighted_loss(
            tok if weights is None else tok * token_weights(weights, ids), counted, None, num_items_in_batch
        )

    def _lb_score(self, step: _Step, losses: Tensor, counted: Tensor | None) -> Tensor | None:
        """Store each trained sample's score (``losses``, one per trained row, or per packed sample
        with its labelled tokens ``counted``); return each one's loss weight (``None`` = all 1)."""
        ds = self.infobatch
        assert ds is not None
        rows, dev, spare = step.rows, losses.device, ds.scores.num_samples
        # no score for a row without a labelled token, or for accelerate's padding (the epoch's last
        # round repeats batches from its start: global positions past the plan's kept samples)
        scores_rows = torch.where(rows.labelled, rows.indices, spare)
        scores_rows[max(0, step.plan.num_kept - step.first) :] = spare
        scores_rows = scores_rows.to(dev, non_blocking=True)
        if counted is not None:  # which samples hold a labelled token the loss read, on the device
            scores_rows = torch.where(counted > 0, scores_rows, spare)
        kept, trained = rows.indices.to(dev, non_blocking=True), losses.shape[0]
        if rows.positions is not None:  # every process stores all its rows, unkept ones nowhere
            at = rows.positions.to(dev)
            kept = kept.index_select(0, at)
            unkept = torch.full_like(scores_rows, spare)
            scores_rows = unkept.index_copy_(0, at, scores_rows.index_select(0, at))
            losses = losses.new_zeros(len(rows)).index_copy_(0, at, losses)
        if kept.shape[0] != trained:
            raise RuntimeError(f"the batch trains {trained} samples but its indices say {kept.shape[0]}")
        ds.sampler.store(scores_rows, losses)
        w = step.plan.weights_on(dev)
        return None if w is None else w.index_select(0, kept)

    # ------------------------------------------------------------------ schedule
    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        ours = self.lr_scheduler is None
        sched = super().create_scheduler(num_training_steps, optimizer)
        ds = self.infobatch
        if ds is None or not ours or not isinstance(sched, LambdaLR) or getattr(sched, "_leanbatch", False):
            return sched  # metric-driven schedules (reduce_lr_on_plateau) need nothing
        sched.lr_lambdas = [_by_progress(f, ds, num_training_steps) for f in sched.lr_lambdas]
        sched._leanbatch = True  # type: ignore[attr-defined]
        return sched

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        ds, sb = self.infobatch, self.selective_backprop
        if ds is not None:
            ds.sampler.merge()  # every process: the merged table is saved
        save_state(self, self._get_output_dir(trial=trial), STATE_FILE, lambda: {
            "version": 1,
            "infobatch": None if ds is None else ds.state_dict(),
            "selective_backprop": None if sb is None else sb.state_dict(),
        })  # fmt: skip
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path, state = load_state(
            checkpoint, STATE_FILE, "leanbatch trainer", "the pruning and selection state"
        )
        for name, obj in (("infobatch", self.infobatch), ("selective_backprop", self.selective_backprop)):
            if (state.get(name) is None) != (obj is None):
                raise ValueError(f"{path} was saved {'without' if obj is not None else 'with'} {name}")
            if obj is not None:
                obj.load_state_dict(state[name])
