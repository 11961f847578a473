"""``TokenSelectionTrainer``: a ``transformers.Trainer`` that trains RHO-1's selected tokens.

The Trainer's own loss path, with :class:`~leanbatch.TokenSelection` as its ``compute_loss_func``:

- ``_get_num_items_in_batch``: the Trainer counts the labelled tokens of every micro-batch of an
  accumulation group (and across processes with ``average_tokens_across_devices``) to normalise
  the loss; here it counts the tokens each micro-batch *keeps* (``TokenSelection.num_kept``, on the
  device), handed to the Trainer's own counting, so its gathering across processes is unchanged.
- ``compute_loss``: the Trainer pops ``labels`` and runs the model; the selection ranks the tokens
  by their loss minus ``reference_model``'s on the same inputs (run without gradient, only when
  the selection ranks by excess loss inside its window), and the kept tokens' summed loss is divided
  by ``num_items_in_batch``. Pre-shifted ``shift_labels`` (padding-free collators) are read too.
- Progress (the schedule's ``start``/``end``) is ``state.global_step / state.max_steps``.
- ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: the selection's state travels in
  ``leanbatch_tokens.pt`` inside each checkpoint folder, so a resumed run draws as the uninterrupted one.
- TRL: ``class SFTTokens(TokenSelectionTrainer, SFTTrainer)`` (this class first) trains the selection
  in ``SFTTrainer``, whose ``compute_loss`` calls the same hook (and runs one more forward, without
  gradient, for its metrics). ``loss_type`` other than ``"nll"`` and label smoothing are refused:
  the hook would silently replace them.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
    >>> from leanbatch import TokenSelection
    >>> cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                   num_attention_heads=2, num_key_value_heads=1)
    >>> model, reference = LlamaForCausalLM(cfg), LlamaForCausalLM(cfg)
    >>> data = [{"input_ids": torch.arange(6) + i % 4, "labels": torch.arange(6) + i % 4} for i in range(8)]
    >>> args = TrainingArguments("/tmp/leanbatch-doctest", max_steps=2, per_device_train_batch_size=4,
    ...                          use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True)
    >>> ts = TokenSelection(keep=0.6)
    >>> trainer = TokenSelectionTrainer(model=model, args=args, train_dataset=data, token_selection=ts,
    ...                                 reference_model=reference)
    >>> _ = trainer.train()  # doctest: +ELLIPSIS
    {'train_runtime': ...}
    >>> ts.counts   # 4 rows of 5 labelled tokens after the shift: 12 kept per step
    {'batches': 2, 'labelled': 40, 'kept': 24}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import Trainer

from leanbatch.hf.checks import check_cross_entropy_args
from leanbatch.hf.packed import is_packed
from leanbatch.hf.state import load_state, save_state
from leanbatch.packing import check_packed_labels, packed_sequence_ids, require_values
from leanbatch.selection.tokens import TokenSelection

__all__ = ["TOKENS_FILE", "TokenSelectionTrainer"]

TOKENS_FILE = "leanbatch_tokens.pt"
"""The file in each checkpoint folder that holds the token selection's state (its draws, its counts)."""

_LABELS = ("labels", "shift_labels")


class TokenSelectionTrainer(Trainer):
    """``transformers.Trainer`` training the tokens ``token_selection`` keeps (see the module docstring).

    Arguments: those of ``Trainer`` (not ``compute_loss_func``: the selection is the loss), and
    ``token_selection`` (a :class:`~leanbatch.TokenSelection`; ``policy="random"`` is the twin, which
    needs no reference) and ``reference_model`` (RHO-1's reference: the same tokenizer and
    vocabulary; moved to the training device, kept in eval mode, never trained; ``None``: rank
    by the loss itself). Combine it with a ``Trainer`` subclass that calls the Trainer's
    ``compute_loss_func`` hook by listing it first: ``class SFTTokens(TokenSelectionTrainer, SFTTrainer)``.
    """

    def __init__(
        self,
        *args: Any,
        token_selection: TokenSelection,
        reference_model: nn.Module | None = None,
        **kwargs: Any,
    ):
        if not isinstance(token_selection, TokenSelection):
            raise TypeError(
                f"token_selection must be a leanbatch.TokenSelection, got {type(token_selection).__name__}"
            )
        if kwargs.pop("compute_loss_func", None) is not None:
            raise ValueError(
                "compute_loss_func: token selection is this trainer's loss; drop compute_loss_func"
            )
        if reference_model is not None and not isinstance(reference_model, nn.Module):
            raise TypeError(
                f"reference_model must be a torch.nn.Module, got {type(reference_model).__name__}"
            )
        super().__init__(*args, **kwargs)
        check_cross_entropy_args(self.args, "token selection")
        # the loss hook, set after __init__: TRL's SFTTrainer warns of a compute_loss_func passed to it
        loss_fn: Any = self._selected_loss
        self.compute_loss_func = loss_fn
        self.token_selection = token_selection
        self.reference_model = reference_model
        if reference_model is not None:
            reference_model.to(self.args.device).eval().requires_grad_(False)
        self._inputs: dict[str, Any] = {}  # this micro-batch's model inputs, for the reference model
        self._shift: Tensor | None = None  # its pre-shifted labels, if the collator made them

    @property
    def progress(self) -> float:
        """The fraction of training done: ``state.global_step / state.max_steps`` (0 before training)."""
        total = self.state.max_steps
        return min(1.0, self.state.global_step / total) if total else 0.0

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> Tensor | int | None:
        """The Trainer's own count over what each micro-batch keeps: its ``shift_labels`` replaced by
        as many counted entries (the rest -100) as the selection keeps of it (no host sync)."""
        marked = []
        for batch in batch_samples:
            targets = _targets(batch, self.token_selection.ignore_index)
            if targets is None:  # no labels: the Trainer counts nothing either
                return super()._get_num_items_in_batch(batch_samples, device)
            k = self.token_selection.num_kept(targets, self.progress)
            first_k = torch.arange(targets.numel(), device=targets.device) < k
            marked.append({**batch, "shift_labels": torch.where(first_k, 0, -100)})
        return super()._get_num_items_in_batch(marked, device)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """The Trainer's ``compute_loss``, the inputs kept for the reference model's forward. A packed
        batch is forwarded (by both models) with ``use_cache=False``: a cache hides its sequences'
        boundaries from attention."""
        if is_packed(inputs):
            labels = inputs.get("labels")
            if "shift_labels" not in inputs and isinstance(labels, Tensor) and labels.dim() == 2:
                # no sequence may start at a label: the shifted loss would train across two sequences
                ids = packed_sequence_ids(
                    labels, position_ids=inputs.get("position_ids"), cu_seq_lens=inputs.get("cu_seq_lens_q")
                )
                check_packed_labels(labels, ids)
            inputs = {**inputs, "use_cache": False}
        self._inputs = {k: v for k, v in inputs.items() if k not in _LABELS}
        self._shift = inputs.get("shift_labels")
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._inputs, self._shift = {}, None

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        save_state(self, self._get_output_dir(trial=trial), TOKENS_FILE, self.token_selection.state_dict)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        _, state = load_state(checkpoint, TOKENS_FILE, "TokenSelectionTrainer", "the token selection's draws")
        self.token_selection.load_state_dict(state)

    def _selected_loss(self, outputs: Any, labels: Tensor | None, num_items_in_batch: Any = None) -> Tensor:
        """``compute_loss_func``: the selected tokens' loss over ``num_items_in_batch`` (the kept tokens)."""
        ts, inputs, shift = self.token_selection, self._inputs, self._shift
        reference = None
        if self.reference_model is not None and ts.policy == "excess" and ts.is_active(self.progress):
            _check_reference_length(self.reference_model, inputs)
            with torch.no_grad():
                reference = self.reference_model(**inputs).logits
        return ts.loss(
            outputs.logits, None if shift is not None else labels, shift_labels=shift, progress=self.progress,
            reference_logits=reference, num_items_in_batch=num_items_in_batch,
        )  # fmt: skip


def _check_reference_length(reference: nn.Module, inputs: dict[str, Any]) -> None:
    """Refuse a batch with positions past the reference's ``max_position_embeddings`` (``n_positions``):
    its logits there are not a reference's (or it fails inside its embedding). No host sync."""
    config = getattr(reference, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    positions, ids = inputs.get("position_ids"), inputs.get("input_ids")
    if not isinstance(limit, int) or not isinstance(ids, Tensor):
        return
    message = (
        f"reference_model takes sequences of up to {limit} positions (its config.max_position_embeddings) "
        "but the batch's sequences are longer: the reference must score the model's inputs as they are; "
        f"cut the data to {limit} tokens (max_length) or use a reference with the model's sequence length"
    )
    if isinstance(positions, Tensor):
        require_values(positions.max() < limit, message)
    elif ids.shape[-1] > limit:
        raise ValueError(message)


def _targets(batch: Any, ignore_index: int) -> Tensor | None:
    """A micro-batch's shifted labels (``shift_labels``, or ``labels`` shifted); None without labels."""
    if "shift_labels" in batch:
        return batch["shift_labels"]
    labels = batch.get("labels") if hasattr(batch, "get") else None
    if not isinstance(labels, Tensor):
        return None
    return torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
