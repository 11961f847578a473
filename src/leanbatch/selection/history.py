"""The paper's own selection rule: a loss percentile against recent history.

Jiang et al. (2019) keep each example with probability ``P = cdf ** beta`` (one Bernoulli draw
each), ``cdf`` its loss's percentile rank among a ring buffer of recent losses (1,024 in the
authors' code; the batch's own pushed first; ties count half, as
``scipy.stats.percentileofscore(kind="rank")``). With ``beta = 3`` about a quarter are kept:
``E[cdf ** beta] = 1 / (beta + 1)``. Buffer and draw are vectorised on the losses' device; as the
count varies, turning the mask into positions reads it (the fixed-count rules need no such read).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_int, check_per_sample_loss, check_real
from leanbatch.selection.rules import Draw, Rule, resolve_generator

__all__ = ["HistoryRule", "LossHistory"]


class LossHistory:
    """Ring buffer of recent per-example losses and the ``cdf ** beta`` selection rule.

    Args:
        size: how many recent losses to remember (1,024 in the paper's code).
        beta: selectivity exponent; larger keeps fewer (3 in the paper's code).

    The buffer follows the losses to their device. Non-finite losses are not remembered; an example
    whose loss is not finite gets probability 1 (it is treated as the hardest, as the rank rule does).

    Example:
        >>> import torch
        >>> h = LossHistory(size=8, beta=1.0)
        >>> h.push(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        >>> h.percentile(torch.tensor([0.5, 2.0, 9.0])).tolist()
        [0.0, 0.5, 1.0]
        >>> mask = h.sample(torch.tensor([0.1, 3.5]), generator=torch.Generator().manual_seed(0))
        >>> mask.dtype, mask.shape
        (torch.bool, torch.Size([2]))
    """

    def __init__(self, size: int = 1024, beta: float = 3.0):
        self.size = check_int(size, "history_size", 1)
        self.beta = check_real(beta, "beta", low=0.0, low_open=True, type_error=True)
        self.values = torch.full((self.size,), float("nan"), dtype=torch.float32)
        self._next = 0  # host-side write position: batch sizes are known on the host
        self._checked: tuple[Any, ...] | None = None  # the losses' shape, dtype and device last checked

    def _own(self, losses: Tensor) -> Tensor:
        """``losses`` as float32 on the buffer's device (which follows them); checked once
        per shape, dtype and device (a sampling step reads them twice, a rule's every step)."""
        key = (losses.shape, losses.dtype, losses.device) if isinstance(losses, Tensor) else None
        if key is None or key != self._checked:
            check_per_sample_loss(losses, "losses")
            self._checked = key
        if losses.device != self.values.device:
            self.values = self.values.to(losses.device)
        return losses.detach().to(self.values.device, torch.float32)

    def push(self, losses: Tensor) -> None:
        """Remember ``losses`` (overwriting the oldest); non-finite ones are not remembered."""
        new = self._own(losses)
        new = torch.where(torch.isfinite(new), new, torch.full_like(new, float("nan")))
        n = new.shape[0]
        if n >= self.size:
            self.values.copy_(new[n - self.size :])
            self._next = 0
            return
        slots = (torch.arange(n, device=new.device) + self._next) % self.size
        self.values.index_copy_(0, slots, new)
        self._next = (self._next + n) % self.size

    def percentile(self, losses: Tensor) -> Tensor:
        """Percentile rank in [0, 1] of each loss among the remembered losses (ties count half)."""
        x = self._own(losses)
        valid = ~torch.isnan(self.values)
        n_valid = valid.sum()
        ordered = torch.sort(torch.where(valid, self.values, torch.full_like(self.values, math.inf))).values
        below = torch.minimum(torch.searchsorted(ordered, x, right=False), n_valid)
        at_or_below = torch.minimum(torch.searchsorted(ordered, x, right=True), n_valid)
        matched = (below < at_or_below).to(torch.float32)
        pct = (below + at_or_below).to(torch.float32) + matched
        pct = pct / (2.0 * n_valid.clamp_min(1).to(torch.float32))
        return torch.where(torch.isfinite(x), pct.clamp(0.0, 1.0), torch.ones_like(pct))

    def probabilities(self, losses: Tensor) -> Tensor:
        """Selection probability ``percentile ** beta`` of each loss."""
        return self.percentile(losses).pow(self.beta)

    def sample(
        self, losses: Tensor, generator: torch.Generator | None = None, at_least_one: bool = True
    ) -> Tensor:
        """Push ``losses``, then draw one Bernoulli per example; returns a bool mask.

        With ``at_least_one`` the highest-probability example is selected when the
        draw selects none, so a training step never gets an empty batch. The draw
        is on the device (no sync); only turning the mask into positions reads.
        """
        self.push(losses)
        probs = self.probabilities(losses)
        gen = resolve_generator(generator, probs.device)
        mask = torch.rand(probs.shape, generator=gen, device=probs.device) < probs
        if at_least_one:
            fallback = torch.zeros_like(mask).index_fill_(0, probs.argmax().view(1), True)
            mask = mask | (fallback & ~mask.any())
        return mask

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        return {
            "size": self.size,
            "beta": self.beta,
            "values": self.values.detach().cpu().clone(),
            "next": self._next,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a buffer saved by :meth:`state_dict`; the sizes must match."""
        if state.get("size") != self.size:
            raise ValueError(f"state_dict is for a history of {state.get('size')} losses, not {self.size}")
        self.values = state["values"].to(self.values.device, torch.float32).clone()
        self._next = int(state["next"])


class HistoryRule(Rule):
    """The paper's rule as a selector's rule: keep each row with probability ``cdf ** beta``
    against a :class:`LossHistory` of ``size`` recent losses; the count varies (``keep`` is ``None``).

    Example:
        >>> import torch
        >>> rule = HistoryRule(size=16, beta=1.0)
        >>> rule.positions(torch.rand(6), Draw(6, torch.device("cpu"), torch.Generator())).dtype
        torch.int64
    """

    name = "history"

    def __init__(self, size: int = 1024, beta: float = 3.0):
        self.history = LossHistory(size, beta)

    def positions(self, scores: Tensor | None, draw: Draw) -> Tensor:
        return self.mask(scores, draw).nonzero().squeeze(1)  # reads the count: this rule's one sync

    def mask(self, scores: Tensor | None, draw: Draw) -> Tensor:
        assert scores is not None
        return self.history.sample(scores, self._ready(scores, draw), at_least_one=draw.at_least_one)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state["history"])
