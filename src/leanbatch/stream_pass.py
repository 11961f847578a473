"""One pass over a stream: the scores frozen at its start and every sample's fate, by key.

The stream's form of an epoch plan (:class:`~leanbatch.policies.plan.Plan`): a map-style plan
lists the indices it keeps; a stream has no index to list, so a pass holds what decides each
sample as it arrives, and nothing per sample it has not seen:

- the **candidates**: the keys whose score, frozen at the pass's start, is below that pass's
  threshold (the mean of the frozen scores), sorted, as int64 (8 bytes each, at most the
  table's capacity);
- the **cut**: a candidate is dropped iff the top 32 bits of ``mix_seed(seed, pass, key)``
  (:func:`~leanbatch.permutation.mix_keys`) are below it, so its drop probability is exactly
  ``cut / 2**32`` (``cut = round(prune_ratio * 2**32)``) and a kept candidate's weight is the
  exact inverse of its inclusion probability, ``2**32 / (2**32 - cut)`` (rounded once, to
  float32, as the map-style policies round it). Never-scored keys and keys at or above the
  threshold are always kept with weight 1.

A sample's fate is a pure function of ``(seed, pass, key)`` and the pass: any loader worker, the
main process recomputing the weights, or a resumed run decides the same.

Example:
    >>> import torch
    >>> p = StreamPass.freeze(1, seed=0, keys=torch.tensor([3, 5, 8]), scores=torch.tensor([0.1, 2.0, 0.2]),
    ...                        prune_ratio=0.5)
    >>> p.candidates.tolist(), round(p.threshold, 4), p.weight
    ([3, 8], 0.7667, 2.0)
    >>> kept, w = p.fates(torch.tensor([3, 5, 8, 99]))
    >>> bool(kept[1]) and bool(kept[3]), w[1].item(), w[3].item()   # above the mean, never scored: kept, 1
    (True, 1.0, 1.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import check_int, check_seed, require
from leanbatch.permutation import mix_keys
from leanbatch.policies.parts import Slice, global_mean

__all__ = ["StreamPass"]

_SCALE = 1 << 32  # drop probabilities are multiples of 2**-32, as the map-style policies'


@dataclass(frozen=True)
class StreamPass:
    """What decides each sample of pass ``index`` as it arrives (see the module docstring)."""

    index: int
    seed: int
    candidates: Tensor  # sorted int64 keys below the threshold (CPU)
    cut: int = 0  # a candidate is dropped iff its 32-bit hash < cut
    threshold: float | None = None

    @classmethod
    def keep_all(cls, index: int, seed: int) -> StreamPass:
        """A pass that keeps every sample with weight 1 (no scores yet, or annealing).

        Example:
            >>> StreamPass.keep_all(0, seed=1).pruning
            False
        """
        return cls(index, seed, torch.empty(0, dtype=torch.int64))

    @classmethod
    def freeze(cls, index: int, seed: int, keys: Tensor, scores: Tensor, prune_ratio: float) -> StreamPass:
        """Freeze ``scores`` (of ``keys``; NaN: never scored) for pass ``index``: InfoBatch's rule."""
        threshold, _ = global_mean(scores, Slice(max(1, scores.numel())))
        if threshold is None:
            return cls.keep_all(index, seed)
        below = scores < threshold  # NaN compares False: never a candidate
        candidates = torch.sort(keys[below]).values
        cut = min(max(round(prune_ratio * _SCALE), 0), _SCALE - 1)
        return cls(index, seed, candidates, cut, threshold)

    @property
    def pruning(self) -> bool:
        """Whether any sample of this pass can be dropped."""
        return self.cut > 0 and self.candidates.numel() > 0

    @property
    def weight(self) -> float:
        """A kept candidate's loss weight: ``float32(2**32 / (2**32 - cut))``."""
        return float(torch.tensor(_SCALE / (_SCALE - self.cut), dtype=torch.float32))

    def fates(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Whether each key (int64, CPU) is kept this pass, and its loss weight (float32).

        Vectorised: a binary search in the candidates and one hash per key.
        """
        if not self.pruning:
            return torch.ones(keys.shape, dtype=torch.bool), torch.ones(keys.shape, dtype=torch.float32)
        cand = self.candidates
        at = torch.searchsorted(cand, keys).clamp_(max=cand.numel() - 1)
        candidate = cand[at] == keys
        drop = candidate & ((mix_keys(keys, self.seed, self.index) >> 31) < self.cut)
        return ~drop, torch.where(candidate & ~drop, self.weight, 1.0).float()

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        return asdict(self)  # the candidates copied

    @classmethod
    def from_state(cls, state: Any) -> StreamPass:
        """A pass saved by :meth:`state_dict`, checked first (``ValueError`` naming the wrong key).

        Example:
            >>> import torch
            >>> p = StreamPass.freeze(2, 7, torch.tensor([1, 2]), torch.tensor([0.0, 1.0]), 0.5)
            >>> StreamPass.from_state(p.state_dict()).candidates.tolist()
            [1]
        """
        state = require(state, ("index", "seed", "candidates", "cut", "threshold"), "state_dict['pass']")
        cand = state["candidates"]
        if not isinstance(cand, Tensor) or cand.dtype != torch.int64 or cand.dim() != 1:
            raise ValueError("state_dict['pass']['candidates'] must be a 1-D int64 tensor of keys")
        if cand.numel() > 1 and bool((cand.diff() <= 0).any()):
            raise ValueError("state_dict['pass']['candidates'] must be sorted and distinct")
        threshold = state["threshold"]
        if threshold is not None and not isinstance(threshold, float):
            raise ValueError(f"state_dict['pass']['threshold'] must be a float or None, got {threshold!r}")
        return cls(
            check_int(state["index"], "state_dict['pass']['index']", 0),
            check_seed(state["seed"], "state_dict['pass']['seed']"),
            cand,
            check_int(state["cut"], "state_dict['pass']['cut']", 0, _SCALE - 1),
            threshold,
        )
