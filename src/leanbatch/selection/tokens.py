"""``TokenSelection``: RHO-1's selective language modelling (Lin et al., NeurIPS 2024).

Of each batch's labelled tokens (label not ``ignore_index``, after the causal shift), train on the
share ``keep`` with the largest *excess loss*: the token's loss minus a reference model's loss on
the same token (without a reference, the largest loss). ``policy="random"`` is its uniform twin:
the same number of tokens, drawn uniformly at random from a private generator.

The count kept of a batch of ``n`` labelled tokens is ``max(1, int(keep * n))`` (none when
``n == 0``), as the row selectors count. It is computed on the device: each token's rank among the
labelled ones comes from one sort of the flattened scores, and a token is kept when its rank is
below the count, so no step reads anything back from the device (no host sync). Ties in the score
are kept in token order (a stable sort).

Example:
    >>> import torch
    >>> ts = TokenSelection(keep=0.7)                          # 2 of 3 labelled tokens
    >>> tok = torch.tensor([[1.0, 4.0, 2.0, 3.0]])             # per-token losses (already shifted)
    >>> ref = torch.tensor([[0.0, 3.5, 0.0, 0.0]])             # a reference model's
    >>> targets = torch.tensor([[5, 6, 7, -100]])              # the last token is not labelled
    >>> ts.kept(tok, targets, progress=0.5, reference_loss=ref).tolist()   # excess: 1, 0.5, 2
    [[True, False, True, False]]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from leanbatch.checks import check_choice, check_fraction, check_int, require
from leanbatch.losses import token_losses
from leanbatch.rng import Generators
from leanbatch.selection.schedule import Scheduled, Window, check_progress

__all__ = ["TokenSelection"]

_POLICIES = ("excess", "random")


class TokenSelection(Scheduled):
    """Train on the ``keep`` share of each batch's labelled tokens with the largest excess loss.

    Args:
        keep: the share of labelled tokens trained, in (0, 1] (RHO-1 kept 60-70%); 1 trains all.
        start, end: the schedule, as the row selectors': selection runs while
            ``start <= progress < end``; outside it every labelled token trains.
        policy: ``"excess"`` (the largest token loss minus the reference's; the largest loss
            without a reference) or ``"random"`` (the uniform twin: the same count at random).
        seed: the random policy's seed (draw ``t`` is seeded from ``(seed, rank, t)``; the global
            random state is never touched). ``rank``: the rank drawn for (default: the process
            group's). ``ignore_index``: the label of tokens that do not count (-100).

    :meth:`loss` takes a causal LM's logits and labels and returns the loss to backpropagate;
    :meth:`kept` is the choice itself, from per-token losses. Bad input is refused at the first
    batch, naming the argument: a loss that is not per token, a reference of another vocabulary
    or sequence length.

    Example:
        >>> import torch
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> logits, labels = torch.randn(2, 5, 11, requires_grad=True), torch.randint(0, 11, (2, 5))
        >>> ts = TokenSelection(keep=0.5, start=0.0, end=1.0)
        >>> loss = ts.loss(logits, labels, progress=0.3, reference_logits=torch.randn(2, 5, 11))
        >>> loss.backward()
        >>> int((logits.grad.abs().sum(-1) > 0).sum())   # 8 labelled tokens after the shift: 4 trained
        4
        >>> twin = TokenSelection(keep=0.5, policy="random", seed=1)
        >>> int(twin.kept(torch.rand(2, 4), labels[:, 1:], progress=0.3).sum())
        4
    """

    def __init__(
        self,
        keep: float = 0.6,
        start: float = 0.0,
        end: float = 1.0,
        *,
        policy: str = "excess",
        seed: int | None = None,
        rank: int | None = None,
        ignore_index: int = -100,
    ):
        self.keep = check_fraction(keep, "keep")
        self.schedule = Window(start, end, interrupt=0)
        self.policy = check_choice(policy, "policy", _POLICIES)
        self.generators = Generators(seed, rank)
        self.ignore_index = check_int(ignore_index, "ignore_index")
        self.draws = 0  # active batches so far: the random policy's draw counter
        self.batches = 0
        self._counts: Tensor | None = None  # (labelled, kept) tokens so far, on the device

    def __repr__(self) -> str:
        return (
            f"TokenSelection(keep={self.keep}, start={self.start}, end={self.end}, "
            f"policy={self.policy!r}, seed={self.seed})"
        )

    def is_active(self, progress: float) -> bool:
        """Whether a batch at ``progress`` is selected (inside the window and ``keep < 1``).

        Example:
            >>> ts = TokenSelection(keep=0.6, start=0.2, end=0.8)
            >>> ts.is_active(0.1), ts.is_active(0.5), ts.is_active(0.8)
            (False, True, False)
        """
        return self.keep < 1.0 and self.schedule.is_active(progress, 0)

    def kept(
        self, token_loss: Tensor, targets: Tensor, *, progress: float, reference_loss: Tensor | None = None
    ) -> Tensor:
        """The tokens trained: a boolean tensor shaped as ``targets``, never an ignored token.

        ``token_loss``: the loss of each token (``(rows, T)``, e.g. ``F.cross_entropy(logits.transpose(1, 2),
        targets, reduction="none")``), aligned with ``targets``, the labels it was computed
        against (already shifted); ``reference_loss``: the reference model's, the same shape.
        Counts one batch (and one draw when active).

        Example:
            >>> import torch
            >>> ts = TokenSelection(keep=0.5, start=0.5)
            >>> ts.kept(torch.tensor([[3.0, 1.0]]), torch.tensor([[1, 2]]), progress=0.1).tolist()  # before the window
            [[True, True]]
        """
        labelled = self._check(token_loss, targets, progress, reference_loss)
        self.batches += 1
        if not self.is_active(progress):
            kept = labelled
        else:
            draw, self.draws = self.draws, self.draws + 1
            if self.policy == "random":
                score = torch.rand(targets.shape, generator=self.generators.get(token_loss.device, draw),
                                   device=token_loss.device)  # fmt: skip
            else:
                score = token_loss.detach().float()
                if reference_loss is not None:
                    score = score - reference_loss.detach().to(score.device, torch.float32)
            kept = _top_share(score, labelled, self.keep)
        counts = torch.stack([labelled.sum(), kept.sum()])
        self._counts = counts if self._counts is None else self._counts.to(counts.device) + counts
        return kept

    def loss(
        self,
        logits: Tensor,
        labels: Tensor | None = None,
        *,
        progress: float,
        shift_labels: Tensor | None = None,
        reference_logits: Tensor | None = None,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor:
        """The loss to backpropagate: the kept tokens' cross-entropy, over their count.

        ``logits``: a causal LM's ``(rows, T, vocab)``; ``labels``: ``(rows, T)``, shifted here
        (position ``t`` predicts label ``t + 1``, as Hugging Face's models do), or
        ``shift_labels``: labels a collator already shifted. ``reference_logits``: a reference
        model's logits on the same inputs (computed without gradient). ``num_items_in_batch``:
        divide the sum by it instead of the kept count (Hugging Face's normalisation over an
        accumulated batch: then it must count the kept tokens, :meth:`num_kept`).

        Example:
            >>> import torch
            >>> ts = TokenSelection(keep=1.0)
            >>> round(float(ts.loss(torch.zeros(1, 3, 4), torch.tensor([[1, 2, 3]]), progress=0.5)), 4)  # log(4)
            1.3863
        """
        targets = _targets(logits, labels, shift_labels, self.ignore_index)
        tok, _ = token_losses(logits, targets, ignore_index=self.ignore_index)
        ref = None
        if reference_logits is not None:
            _same_shape(reference_logits, logits)
            with torch.no_grad():
                ref, _ = token_losses(reference_logits.detach(), targets, ignore_index=self.ignore_index)
        kept = self.kept(tok, targets, progress=progress, reference_loss=ref)
        total = (tok * kept).sum()
        if num_items_in_batch is None:
            return total / kept.sum().clamp(min=1)
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def num_kept(self, targets: Tensor, progress: float) -> Tensor:
        """How many tokens a batch with these (shifted) ``targets`` keeps at ``progress``: a device
        tensor, read without a sync (for ``num_items_in_batch``). Counts nothing.

        Example:
            >>> import torch
            >>> TokenSelection(keep=0.5).num_kept(torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]]), 0.5)
            tensor(2)
        """
        n = (targets != self.ignore_index).sum()
        return _count(n, self.keep) if self.is_active(progress) else n

    @property
    def counts(self) -> dict[str, int]:
        """Labelled and kept tokens so far (reads the device: call it when logging, not per step).

        Example:
            >>> import torch
            >>> ts = TokenSelection(keep=0.5)
            >>> _ = ts.kept(torch.rand(1, 4), torch.tensor([[1, 2, 3, 4]]), progress=0.5)
            >>> ts.counts
            {'batches': 1, 'labelled': 4, 'kept': 2}
        """
        labelled, kept = (0, 0) if self._counts is None else (int(v) for v in self._counts.tolist())
        return {"batches": self.batches, "labelled": labelled, "kept": kept}

    def state_dict(self) -> dict[str, Any]:
        """The draw counter and the counts (plain values; ``torch.load(weights_only=True)`` reads it).

        Example:
            >>> import torch
            >>> a, b = TokenSelection(keep=0.5, policy="random", seed=3), TokenSelection(keep=0.5, policy="random", seed=3)
            >>> t = torch.tensor([[1, 2, 3, 4, 5, 6]])
            >>> _ = a.kept(torch.zeros(1, 6), t, progress=0.5)
            >>> b.load_state_dict(a.state_dict())
            >>> torch.equal(a.kept(torch.zeros(1, 6), t, progress=0.5), b.kept(torch.zeros(1, 6), t, progress=0.5))
            True
        """
        return {"draws": self.draws, "policy": self.policy, "keep": self.keep, **self.counts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (refused, changing nothing, when saved with
        another policy or keep)."""
        saved = require(
            state, ("draws", "policy", "keep", "batches", "labelled", "kept"), "TokenSelection state"
        )
        if saved["policy"] != self.policy or float(saved["keep"]) != self.keep:
            raise ValueError(
                f"state_dict was saved by TokenSelection(keep={saved['keep']}, policy={saved['policy']!r}), "
                f"this one has keep={self.keep}, policy={self.policy!r}: build it with the saved settings"
            )
        draws, batches = check_int(saved["draws"], "draws", 0), check_int(saved["batches"], "batches", 0)
        labelled, kept = check_int(saved["labelled"], "labelled", 0), check_int(saved["kept"], "kept", 0)
        self.draws, self.batches = draws, batches
        self._counts = torch.tensor([labelled, kept])

    def _check(self, token_loss: Any, targets: Any, progress: Any, reference_loss: Any) -> Tensor:
        """The labelled tokens of ``targets``, after checking every argument (nothing counted yet)."""
        check_progress(progress)
        if not isinstance(targets, Tensor) or targets.is_floating_point() or targets.dim() < 1:
            raise TypeError(
                "targets must be an integer tensor of token labels (ignore_index marks the ignored)"
            )
        if not isinstance(token_loss, Tensor) or tuple(token_loss.shape) != tuple(targets.shape):
            raise ValueError(
                f"token_loss must be per token, shaped as the labels {tuple(targets.shape)}, got {_shape(token_loss)}: compute it "
                "with reduction='none' and do not average over the tokens (e.g. F.cross_entropy(logits.transpose(1, "
                "2), labels, reduction='none'))"
            )
        if reference_loss is not None and (
            not isinstance(reference_loss, Tensor) or reference_loss.shape != token_loss.shape
        ):
            raise ValueError(
                f"reference_loss must be the reference model's loss of the same tokens, shaped {tuple(token_loss.shape)}, "
                f"got {_shape(reference_loss)}: run the reference on the same input_ids with reduction='none'"
            )
        return targets.to(token_loss.device) != self.ignore_index


def _shape(value: Any) -> Any:
    """``value``'s shape, or its type's name when it is no tensor (for an error message)."""
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def _count(n: Tensor, keep: float) -> Tensor:
    """``max(1, int(keep * n))`` on the device (0 when ``n == 0``), as :func:`num_selected` counts."""
    k = torch.floor(n.double() * keep).to(torch.int64).clamp(min=1)
    return torch.where(n > 0, k, torch.zeros_like(k))


def _top_share(score: Tensor, labelled: Tensor, keep: float) -> Tensor:
    """The labelled tokens whose score ranks in the top ``max(1, int(keep * n))`` of the labelled ones."""
    flat, mask = score.reshape(-1), labelled.reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    order = order[torch.argsort((~mask[order]).to(torch.uint8), stable=True)]  # labelled first, by score
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    k = _count(mask.sum(), keep)
    return ((rank < k) & mask).view(labelled.shape)


def _targets(logits: Any, labels: Tensor | None, shift_labels: Tensor | None, ignore_index: int) -> Tensor:
    """The label of each position of ``logits``: ``shift_labels``, or ``labels`` shifted by one."""
    if not isinstance(logits, Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(
            f"logits must be a causal LM's per-token logits (rows, seq_len, vocab), got {_shape(logits)}: token selection "
            "needs one loss per token; a per-sample or already averaged loss cannot be selected by token"
        )
    if (labels is None) == (shift_labels is None):
        raise TypeError("pass labels= (shifted here) or shift_labels= (already shifted), exactly one of them")
    given, name = (labels, "labels") if shift_labels is None else (shift_labels, "shift_labels")
    if (
        not isinstance(given, Tensor)
        or given.is_floating_point()
        or tuple(given.shape) != tuple(logits.shape[:2])
    ):
        raise ValueError(
            f"{name} must be integer token ids shaped as the logits' first two dimensions "
            f"{tuple(logits.shape[:2])}, got {_shape(given)}"
        )
    return given if shift_labels is not None else F.pad(given, (0, 1), value=ignore_index)[..., 1:]


def _same_shape(reference_logits: Any, logits: Tensor) -> None:
    """Refuse a reference whose logits are not of the same tokens and vocabulary."""
    if not isinstance(reference_logits, Tensor) or reference_logits.dim() != 3:
        raise ValueError(
            f"reference_logits must be (rows, seq_len, vocab) like the logits, got {_shape(reference_logits)}"
        )
    if reference_logits.shape[-1] != logits.shape[-1]:
        raise ValueError(
            f"reference_logits has a vocabulary of {reference_logits.shape[-1]} but the model's logits have "
            f"{logits.shape[-1]}: the reference model must share the model's tokenizer and vocabulary (slice "
            "away padded vocabulary entries of either model first)"
        )
    if reference_logits.shape[:2] != logits.shape[:2]:
        raise ValueError(
            f"reference_logits covers {tuple(reference_logits.shape[:2])} (rows, seq_len) but the logits "
            f"{tuple(logits.shape[:2])}: run the reference model on the same input_ids (same rows, no truncation)"
        )
