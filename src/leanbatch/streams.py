"""InfoBatch for streams: epoch-level pruning of data that has no index, only a key per sample.

:class:`StreamInfoBatch` is :class:`~leanbatch.InfoBatch`'s rule on a stream (a Hugging Face
streaming dataset, an ``IterableDataset``, a generator function). Its three parts, each owning
its state:

- :class:`~leanbatch.keyed_scores.KeyedScoreTable` (``.scores``): the last loss of each key, for
  at most ``capacity`` keys (bounded memory; past it, the oldest keys are forgotten);
- :class:`~leanbatch.stream_pass.StreamPass` (``.current``): the pass, frozen by :meth:`set_pass`
  from the scores at its start: the keys below the mean, and the hash cut that decides which of
  them are dropped (``prune_ratio``) and the weight of those kept;
- :class:`~leanbatch.stream_data.PrunedStream` (``.dataset``): what the ``DataLoader`` reads,
  deciding each item's fate as it arrives, before collation, in any worker.

:meth:`update` (``update(loss, keys)``) checks the batch, stores the losses as the keys' scores and
returns the weighted mean. The weights are not carried with the batch: each key's weight is a
pure function of the pass and the key, recomputed here from the keys.

Under ``torch.distributed`` each rank reads its own part of the stream and the ranks merge their
scores at each ``set_pass`` (docs/streams.md, "Several processes").

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> stream = lambda: ({"id": i, "x": float(i)} for i in range(8))   # a generator function
    >>> sib = StreamInfoBatch(stream, num_passes=3, key="id", prune_ratio=0.5, delta=1.0)
    >>> loader = DataLoader(sib.dataset, batch_size=4)
    >>> for p in range(3):
    ...     sib.set_pass(p)
    ...     for batch in loader:
    ...         loss = sib.update(batch["x"] * 0.1, batch["id"])   # per-sample losses, their keys
    ...     print(p, sib.stats()["trained_in_pass"])   # ids 0-3 below the mean: each dropped with p 0.5
    0 8
    1 5
    2 6
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from leanbatch.checks import check_int, check_per_sample_loss, check_ratio, check_real, check_seed, require
from leanbatch.keyed_scores import KeyedScoreTable, check_keys
from leanbatch.policies.base import pruning_epochs
from leanbatch.ranks import is_distributed, world_size
from leanbatch.stream_data import KeySpec, PrunedStream
from leanbatch.stream_pass import StreamPass

__all__ = ["StreamInfoBatch"]


class StreamInfoBatch:
    """InfoBatch on a stream: scores by key, fates decided per sample as it arrives, by ``(seed, pass, key)``.

    Args:
        stream: the data: an ``IterableDataset`` (e.g. ``datasets.IterableDataset``, streaming),
            a re-iterable, or a generator function (not a generator object).
        num_passes: how many passes training makes; passes from ``floor(delta * num_passes)``
            keep every sample (annealing). Or, for a stream without passes,
        num_samples: the training budget in samples: a pass that starts once ``delta *
            num_samples`` samples were trained keeps every sample. Exactly one of the two.
        key: where each item's key (a stable integer id, ``0 <= key < 2**63 - 1``) is: a field
            name, a position, or a function of the item (items then come as ``(item, key)``).
        prune_ratio: the share of the below-mean samples dropped each pruning pass (0.5, the
            paper's); delta: the share of the run that prunes (0.875).
        seed: the pruning hash's seed: the same seed and scores give the same fates.
        capacity: the most keys scored at once (memory: about 40 bytes per key of capacity,
            see :class:`~leanbatch.keyed_scores.KeyedScoreTable`; 1,048,576 by default).
        transform: applied to kept items only, after the decision (e.g. tokenisation).
        device: where the scores live (default: where the losses are).
    """

    def __init__(
        self,
        stream: Any,
        num_passes: int | None = None,
        *,
        key: KeySpec,
        num_samples: int | None = None,
        prune_ratio: float = 0.5,
        delta: float = 0.875,
        seed: int = 0,
        capacity: int = 1 << 20,
        transform: Callable[[Any], Any] | None = None,
        device: torch.device | str | None = None,
    ):
        if (num_passes is None) == (num_samples is None):
            raise ValueError(
                "give exactly one of num_passes (a stream read in passes: passes from floor(delta * "
                "num_passes) keep every sample) and num_samples (a budget of trained samples, for a "
                "stream without passes)"
            )
        self.num_passes = None if num_passes is None else check_int(num_passes, "num_passes", 1)
        self.num_samples = None if num_samples is None else check_int(num_samples, "num_samples", 1)
        self.prune_ratio = check_ratio(
            prune_ratio,
            "prune_ratio",
            "the share of below-mean samples dropped per pass (0.5 is the paper's)",
        )
        self.delta = check_real(
            delta,
            "delta",
            0.0,
            1.0,
            low_open=True,
            hint="the share of the run that prunes (0.875 is the paper's)",
        )
        self.seed = check_seed(seed)
        self.scores = KeyedScoreTable(capacity, device)
        self.dataset = PrunedStream(stream, key, transform)
        self.dataset.on_epoch = self.set_pass
        self.current = self.dataset.current = StreamPass.keep_all(0, self.seed)
        self._start = 0  # samples trained before this pass (by every rank)
        self._in_pass = self._steps = 0  # samples and updates of this pass (this rank's)
        self._last_steps = 0  # the last finished pass's updates (the most any rank made)
        self._batch = 0  # this rank's first batch's size (the samples per update, per rank, under DDP)

    # ------------------------------------------------------------------ passes
    @property
    def pass_index(self) -> int:
        """The current pass (0-based); after a resume, the pass to continue."""
        return self.current.index

    def prunes(self, index: int) -> bool:
        """Whether pass ``index``, started now, may prune (annealing by passes or by the budget).

        Example:
            >>> sib = StreamInfoBatch(lambda: iter(()), num_passes=8, key="id")
            >>> [sib.prunes(p) for p in (0, 6, 7)]
            [True, True, False]
        """
        if self.prune_ratio == 0:
            return False
        if self.num_passes is not None:
            return index < pruning_epochs(self.num_passes, self.delta)
        assert self.num_samples is not None
        return self._start + self._in_pass < self.delta * self.num_samples

    def set_pass(self, index: int) -> None:
        """Start pass ``index``: freeze the scores for it (once: the same pass again changes nothing).

        Call it before each pass's ``iter(loader)`` (as ``DistributedSampler.set_epoch``); the
        Hugging Face Trainer calls it through ``dataset.set_epoch``. The source's own
        ``set_epoch`` (a Hugging Face stream's shuffling) is called too. Under ``torch.distributed``
        it is a collective, called on every rank: the ranks' settings are checked to agree, their
        score tables merged and their counts summed (``_exchange``), so every rank freezes the
        same pass.
        """
        index = check_int(index, "index", 0)
        if index == self.current.index:
            return
        trained, steps = _exchange(self, index) if is_distributed() else (self._in_pass, self._steps)
        self._start, self._last_steps, self._in_pass, self._steps = self._start + trained, steps, 0, 0
        if self.prunes(index):
            keys, values = self.scores.items()  # one device-to-host copy per pass
            current = StreamPass.freeze(index, self.seed, keys, values, self.prune_ratio)
        else:
            current = StreamPass.keep_all(index, self.seed)
        self._enter(current)

    def _enter(self, current: StreamPass) -> None:
        """Make ``current`` the pass the stream decides with, and the source's epoch."""
        self.current = self.dataset.current = current
        self.scores.clock = current.index
        source_epoch = getattr(self.dataset.source, "set_epoch", None)
        if callable(source_epoch):
            source_epoch(current.index)

    # ------------------------------------------------------------------ one step
    def update(self, loss: Tensor, keys: Any) -> Tensor:
        """Store ``loss`` (per sample) as the scores of ``keys`` and return the weighted mean.

        The weights are those of the pass that decided the batch: the exact inverse inclusion
        probability for kept below-mean samples, 1 for the others. The mean is taken in float32
        as ``sum(loss * (weight / n))``, so no partial sum exceeds the result: it overflows only
        if the weighted mean itself is beyond float32 (never in fp16/bf16, whose range float32
        holds). Checked before anything is stored: a key seen before in this pass, a key this
        pass dropped (the batch did not come from ``.dataset`` for this pass), mismatched shapes.
        No host-device sync: keys are on the CPU (as the loader gives them; keys on a device
        are copied back, one sync), weights go to the loss's device asynchronously.
        """
        loss = check_per_sample_loss(loss)
        keys = check_keys(keys)
        n = loss.shape[0]
        if keys.shape[0] != n:
            raise ValueError(f"loss has {n} entries but keys has {keys.shape[0]}: pass one loss per key")
        rows = self.scores.lookup(keys)
        ordered = torch.sort(keys).values  # a key twice in the batch, or trained before in this pass
        twice = torch.cat([ordered[1:][ordered[1:] == ordered[:-1]], keys[self.scores.seen(rows)]])
        if twice.numel():
            k = int(twice[0])
            raise ValueError(
                f"keys: two items with key {k} in pass {self.current.index}: a key names one sample, seen once a "
                "pass. Call set_pass(p) before each pass; with worker processes, each must read its own part "
                "of the stream (an IterableDataset shards by torch.utils.data.get_worker_info()); keys must be "
                "unique in the stream"
            )
        kept, w = self.current.fates(keys)
        if not bool(kept.all()):
            k = int(keys[~kept][0])
            raise ValueError(
                f"keys: key {k} was dropped in pass {self.current.index}, yet it was trained: train on batches "
                "of sib.dataset, and call set_pass(p) before iter(loader) for each pass"
            )
        self.scores.put(keys, loss, rows)
        self._in_pass += n
        self._steps += 1
        self._batch = self._batch or n
        w = w.to(loss.device, non_blocking=True).mul_(1.0 / max(n, 1))  # an empty batch: 0
        return (loss.float() * w).sum()

    # ------------------------------------------------------------------ reads
    @property
    def progress(self) -> float:
        """The fraction of training done, for :class:`~leanbatch.ProgressLR` and selection windows.

        With ``num_samples``: samples trained over the budget. With ``num_passes``: passes done,
        plus this pass's share measured in updates by the last pass's (0 in the first pass).
        Under ``torch.distributed`` it is the same on every rank at every step (ranks update in
        lockstep): the samples of the passes before this one, counted on every rank, plus this
        pass's updates times the world's samples per update (``world * `` the first batch's size).
        """
        if self.num_samples is not None:
            done = self._steps * self._batch * world_size() if is_distributed() else self._in_pass
            return min(1.0, (self._start + done) / self.num_samples)
        assert self.num_passes is not None
        within = min(1.0, self._steps / self._last_steps) if self._last_steps else 0.0
        return min(1.0, (self.current.index + within) / self.num_passes)

    def stats(self) -> dict[str, Any]:
        """Counts: trained (all passes, this pass), keys scored and forgotten, the pass's threshold."""
        return {
            "pass": self.current.index,
            "trained": self._start + self._in_pass,
            "trained_in_pass": self._in_pass,
            "keys": self.scores.count,
            "evicted": self.scores.evicted,
            "candidates": int(self.current.candidates.numel()),
            "threshold": self.current.threshold,
        }

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The scores, the current pass (its frozen candidates), the counts: tensors and plain values.

        Save it beside the model's and (mid-pass) a ``StatefulDataLoader``'s; load it first.
        """
        return {
            "scores": self.scores.state_dict(),
            "pass": self.current.state_dict(),
            "trained": self._start + self._in_pass,
            "in_pass": self._in_pass,
            "steps": self._steps,
            "last_steps": self._last_steps,
            "batch": self._batch,
            "prune_ratio": self.prune_ratio,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first); the stream continues the saved pass."""
        names = ("trained", "in_pass", "steps", "last_steps", "batch")
        saved = require(state, ("scores", "pass", *names), "state_dict")
        current = StreamPass.from_state(saved["pass"])
        if current.seed != self.seed or saved.get("prune_ratio") != self.prune_ratio:
            raise ValueError(
                f"state_dict was saved with seed={current.seed}, prune_ratio={state.get('prune_ratio')}; this "
                f"StreamInfoBatch has seed={self.seed}, prune_ratio={self.prune_ratio}: build it with the saved "
                "ones, or the resumed pass would decide differently"
            )
        trained, *counts = [check_int(saved[k], f"state_dict[{k!r}]", 0) for k in names]
        self.scores.load_state_dict(saved["scores"])
        self._in_pass, self._steps, self._last_steps, self._batch = counts
        self._start = trained - self._in_pass
        self._enter(current)


def _exchange(sib: StreamInfoBatch, index: int) -> tuple[int, int]:
    """``set_pass``'s collective: check the ranks agree, merge their score tables (so all freeze the same
    pass); return the finished pass's samples (all ranks) and updates (the most)."""
    settings = {k: getattr(sib, k) for k in ("seed", "prune_ratio", "delta", "num_passes", "num_samples")}
    settings.update({"capacity": sib.scores.capacity, "pass": sib.current.index, "set_pass": index})
    table = sib.scores.state_dict()
    mine = (settings, (table["keys"], table["values"], table["stamps"]), sib._in_pass, sib._steps, sib._batch)
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, mine)
    for r, (theirs, *_) in enumerate(parts):
        wrong = {k: (v, theirs[k]) for k, v in parts[0][0].items() if theirs[k] != v}
        if wrong:
            raise ValueError(
                f"StreamInfoBatch: rank {r} differs from rank 0 in {', '.join(wrong)} (rank 0's, rank {r}'s: "
                f"{list(wrong.values())}): build it with the same arguments on every rank, and call "
                "set_pass(p) on every rank before each pass (the ranks merge their scores there)"
            )
    batches = {p[4] for p in parts if p[4]}
    if sib.num_samples is not None and len(batches) > 1:
        raise ValueError(
            f"StreamInfoBatch: the ranks train batches of {sorted(batches)} samples: give every rank's "
            "loader the same batch_size (progress counts every rank's samples per update alike)"
        )
    sib.scores.merge([p[1] for p in parts])
    return sum(p[2] for p in parts), max(p[3] for p in parts)
