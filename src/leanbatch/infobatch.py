"""``InfoBatch``: the drop-in dataset wrapper (Qin et al., ICLR 2024).

Three changes to a training loop: wrap the dataset, pass ``sampler=ds.sampler``
to the DataLoader, and return ``ds.update(per_sample_loss)`` as the loss. The
batches stay the user's own items; no torch internals are patched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset

from leanbatch.policies import InfoBatchPolicy, Policy, RandomPolicy
from leanbatch.sampler import PrunedSampler
from leanbatch.scores import ScoreTable, check_per_sample_loss

__all__ = ["InfoBatch"]


class InfoBatch(Dataset):
    """Wrap a map-style dataset so that well-learned samples are pruned each epoch.

    Args:
        dataset: any map-style dataset (``__len__`` and ``__getitem__``).
        num_epochs: total training epochs (annealing starts at ``floor(delta * num_epochs)``).
        prune_ratio: fraction of the below-mean-loss samples dropped per pruning epoch, in [0, 1).
        delta: fraction of the epochs that prune, in (0, 1]; the rest train on all data.
        seed: seeds the plans (with the epoch); the global RNGs are never touched.
        policy: ``"infobatch"`` (default), ``"random"`` (dynamic random pruning, the
            honest baseline at the same expected work) or a :class:`~leanbatch.policies.Policy`.
        ema: optional EMA momentum for the scores (None keeps the last loss).
        device: where the score table lives; by default it follows the losses.
        num_replicas, rank, drop_last: data-parallel sharding (defaults from torch.distributed).

    Example:
        >>> import torch, torch.nn.functional as F
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> data = TensorDataset(torch.randn(64, 3), torch.randint(0, 2, (64,)))
        >>> ds = InfoBatch(data, num_epochs=2, prune_ratio=0.5, delta=0.5, seed=0)
        >>> model = torch.nn.Linear(3, 2)
        >>> loader = DataLoader(ds, batch_size=16, sampler=ds.sampler)
        >>> for epoch in range(2):
        ...     ds.set_epoch(epoch)
        ...     for x, y in loader:
        ...         loss = ds.update(F.cross_entropy(model(x), y, reduction="none"))
        ...         loss.backward()
        >>> [s["kept"] <= 64 for s in ds.epoch_stats]
        [True, True]
    """

    def __init__(
        self,
        dataset: Any,
        num_epochs: int,
        prune_ratio: float = 0.5,
        delta: float = 0.875,
        *,
        seed: int = 0,
        policy: str | Policy = "infobatch",
        ema: float | None = None,
        device: torch.device | str | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ):
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise TypeError(
                "dataset must be a map-style dataset with __len__ and __getitem__; InfoBatch prunes by "
                "index, so an IterableDataset cannot be wrapped"
            )
        try:
            n = len(dataset)
        except TypeError as e:
            raise TypeError("dataset must define __len__ (a map-style dataset)") from e
        if n < 1:
            raise ValueError("dataset is empty: InfoBatch needs at least one sample")
        if isinstance(policy, str):
            kinds: dict[str, type[InfoBatchPolicy] | type[RandomPolicy]] = {
                "infobatch": InfoBatchPolicy,
                "random": RandomPolicy,
            }
            if policy not in kinds:
                raise ValueError(f"policy must be one of {sorted(kinds)} or a Policy object, got {policy!r}")
            policy_obj: Policy = kinds[policy](prune_ratio, num_epochs, delta)
        else:
            InfoBatchPolicy(prune_ratio, num_epochs, delta)  # validates the arguments all the same
            policy_obj = policy
        self.dataset = dataset
        self.num_epochs = num_epochs
        self.prune_ratio = prune_ratio
        self.delta = delta
        self.scores = ScoreTable(n, device=device, ema=ema)
        self.sampler = PrunedSampler(
            self.scores, policy_obj, seed=seed, num_replicas=num_replicas, rank=rank, drop_last=drop_last
        )

    # ------------------------------------------------------------------ dataset
    def __len__(self) -> int:
        return self.scores.num_samples

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        # Delegate unknown attributes to the wrapped dataset (e.g. .classes), but never
        # while unpickling or for dunder lookups: that is what makes the official wrapper
        # recurse forever under spawn and deepcopy.
        if name.startswith("__") or "dataset" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["dataset"], name)

    # ------------------------------------------------------------------ training
    def set_epoch(self, epoch: int) -> None:
        """Serve ``epoch`` (0-based) next; same as ``ds.sampler.set_epoch(epoch)``."""
        self.sampler.set_epoch(epoch)

    def update(self, loss: Tensor, indices: Tensor | None = None) -> Tensor:
        """Store per-sample losses as scores and return the weighted mean loss.

        Args:
            loss: shape (batch,), one loss per sample, any float dtype, with grad.
                Not modified in place. NaN/Inf entries are not stored (counted in
                :attr:`nonfinite_count`) but still show in the returned mean.
            indices: dataset indices of the batch; by default the next ``batch``
                samples this wrapper's sampler served, in order.

        Returns:
            ``mean(loss * weight)``: the InfoBatch-rescaled loss to backpropagate.
        """
        loss = check_per_sample_loss(loss)
        n = loss.shape[0]
        if indices is None:
            idx, plan = self.sampler.claim(n)
            w = self.sampler.weights_on(plan, loss.device)
            idx = self.scores.store(idx, loss, check=False)
            return loss.mean() if w is None else (loss * w.index_select(0, _on(idx, w))).mean()
        if not isinstance(indices, Tensor):
            indices = torch.as_tensor(indices)
        if indices.dim() != 1 or indices.is_floating_point() or indices.dtype == torch.bool:
            raise TypeError(
                f"indices must be a 1-D integer tensor, got {indices.dtype} {tuple(indices.shape)}"
            )
        if indices.shape[0] != n:
            raise ValueError(
                f"loss has {n} entries but indices has {indices.shape[0]}: pass one loss per index"
            )
        if indices.device.type == "cpu":
            # Our own copy: a caller's CPU tensor can alias memory that changes without torch
            # knowing (torch.from_numpy of a reused array), which no version check would see.
            indices = indices.clone() if indices.dtype == torch.int64 else indices.long()
        w = self.sampler.weights_on(self.sampler.current_plan(), loss.device)
        w_batch: Tensor | None
        if w is not None and w.device.type == "cpu" and indices.device.type == "cpu":
            # Gathering the weights checks the range for free on CPU; the message comes from check_indices.
            try:
                w_batch = w.index_select(0, indices)
            except (IndexError, RuntimeError):
                self.scores.check_indices(indices)
                raise
            self.scores.store(indices, loss, check=False)
        else:  # annealing epochs, or devices: an explicit check (asynchronous on CUDA)
            idx = self.scores.store(indices, loss, check=True)
            w_batch = None if w is None else w.index_select(0, _on(idx, w))
        self.sampler.note_explicit(n)
        return loss.mean() if w_batch is None else (loss * w_batch).mean()

    def next_indices(self, n: int) -> Tensor:
        """Claim the dataset indices (int64, CPU) of the next ``n`` served samples, in order.

        What ``update(loss)`` does internally; use it when a loop needs the indices
        itself, e.g. to stack batch-level selection: claim, then ``update(loss, idx)``.
        """
        return self.sampler.claim(n)[0]

    def weights(self, indices: Tensor) -> Tensor:
        """The current epoch's loss weights (float32) of dataset ``indices``, on their device."""
        self.scores.check_indices(indices)
        w = self.sampler.weights_on(self.sampler.current_plan(), indices.device)
        if w is None:
            return torch.ones(indices.shape, dtype=torch.float32, device=indices.device)
        return w[indices]

    # ------------------------------------------------------------------ statistics
    @property
    def epoch_stats(self) -> list[dict[str, Any]]:
        """One dict per planned epoch.

        Keys: ``epoch``, ``num_samples``, ``kept``, ``pruned``, ``threshold`` (None when not
        pruning), ``pruning``, ``padded``/``dropped`` (equal-length DDP shards) and
        ``nonfinite_so_far`` (NaN/Inf losses skipped before this epoch was planned).
        """
        return self.sampler.epoch_stats

    def get_pruned_count(self) -> int:
        """Total sample forwards saved so far (pruned samples summed over planned epochs)."""
        return sum(int(s["pruned"]) for s in self.sampler.epoch_stats)

    @property
    def nonfinite_count(self) -> int:
        """How many NaN/Inf losses were skipped, not stored (reading it syncs on CUDA)."""
        return int(self.scores.nonfinite_count)

    @property
    def progress(self) -> float:
        """Fraction of training done, counted in consumed samples: (epoch + pos / len) / num_epochs."""
        epoch, pos, length, _ = self.sampler.position()
        frac = pos / length if length else 0.0
        return min(1.0, (epoch + frac) / self.num_epochs)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Scores, epoch, position inside it, its plan, statistics: loads with weights_only=True."""
        return {"version": 1, "scores": self.scores.state_dict(), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where :meth:`state_dict` was taken (same dataset size required)."""
        if not isinstance(state, dict) or "scores" not in state or "sampler" not in state:
            raise ValueError("state_dict must come from InfoBatch.state_dict()")
        self.scores.load_state_dict(state["scores"])
        self.sampler.load_state_dict(state["sampler"])


def _on(idx: Tensor, like: Tensor) -> Tensor:
    """``idx`` on ``like``'s device (asynchronously)."""
    return idx if idx.device == like.device else idx.to(like.device, non_blocking=True)
