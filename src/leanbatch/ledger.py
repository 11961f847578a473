"""The ledger of one iteration over an epoch: what was served, and how much of it was trained.

Loaders read ahead, so the samples a sampler has served run ahead of those an update has
trained. :class:`Iteration` keeps the served dataset indices in order, in the chunks they
were made in, and drops a chunk once it has been trained to its end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from leanbatch.permutation import KeyedPermutation
from leanbatch.policies import Plan

__all__ = ["Iteration"]


@dataclass
class Iteration:
    """One ``iter()`` over one epoch's plan, and the ledger of what it served but has not trained.

    Positions count this rank's samples of the epoch, ``0 .. length``; a resumed epoch's
    iteration starts inside (``start``). ``served`` runs ahead of ``trained`` by what the
    loader has read ahead; ``chunks`` hold those served, untrained indices in order.
    """

    epoch: int
    plan: Plan
    key: int  # of the serving order
    length: int
    start: int
    served: int
    trained: int
    chunks: deque[Tensor] = field(default_factory=deque)
    head: int = 0  # position of chunks[0][0]
    head_end: int = 0  # position just past chunks[0]
    ran_out: bool = False  # the consumer pulled past its last sample
    batch: int = 0  # size of its first update (update(loss) checks later ones against it)
    perm: KeyedPermutation | None = None  # the epoch's serving order

    def __post_init__(self) -> None:
        self.perm = KeyedPermutation(self.plan.num_kept, self.key)
        self.head = self.head_end = self.served

    @property
    def done(self) -> bool:
        """Every sample of the epoch has been trained."""
        return self.trained == self.length

    def add(self, indices: Tensor) -> None:
        """Record the next served chunk of dataset indices."""
        if not self.chunks:
            self.head, self.head_end = self.served, self.served + indices.numel()
        self.chunks.append(indices)
        self.served += indices.numel()

    def take(self, n: int, indices: bool) -> Tensor | None:
        """Mark the next ``n`` served samples trained; their dataset indices if asked."""
        out = self.peek(n) if indices else None
        self.trained += n
        while self.trained >= self.head_end and self.chunks:  # drop chunks trained to their end
            self.chunks.popleft()
            self.head = self.head_end
            self.head_end += self.chunks[0].numel() if self.chunks else 0
        return out

    def peek(self, n: int) -> Tensor:
        """The dataset indices of the next ``n`` served, untrained samples (nothing marked)."""
        offset = self.trained - self.head
        if self.trained + n <= self.head_end:  # the common step: within one chunk
            return self.chunks[0][offset : offset + n]
        parts, need = [], n
        for chunk in self.chunks:
            step = min(need, chunk.numel() - offset)
            parts.append(chunk[offset : offset + step])
            need -= step
            offset = 0
            if not need:
                break
        return parts[0] if len(parts) == 1 else torch.cat(parts)
