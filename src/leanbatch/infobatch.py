"""``InfoBatch``: the drop-in dataset wrapper (Qin et al., ICLR 2024).

Three changes to a training loop: wrap the dataset, pass ``sampler=ds.sampler``
to the DataLoader, and return ``ds.update(per_sample_loss)`` as the loss. The
batches stay the user's own items; no torch internals are patched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from leanbatch.checks import check_index_tensor, check_per_sample_loss, require
from leanbatch.inputs import _check_positions, _dataset_length, _make_policy, _on, _unscored, table_slice
from leanbatch.policies import Plan, Policy
from leanbatch.record import Position, TrainingRecord
from leanbatch.sampler import PrunedSampler
from leanbatch.scores import ScoreTable
from leanbatch.state import record_state

if TYPE_CHECKING:
    from leanbatch.carrier import ScoreCarrier

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
            honest baseline at the same expected work) or a :class:`~leanbatch.policies.Policy`
            object (e.g. ``RS2Policy``, ``UCBPolicy``, ``SeTaPolicy``, or ``InfoBatchPolicy``
            with its short-schedule options), which brings its own hyperparameters:
            ``prune_ratio`` and ``delta`` here then only apply to string policies.
        ema: optional EMA momentum for the scores (None keeps the last loss). A policy object
            that ranks by an EMA (``EpsilonGreedyPolicy``, ``UCBPolicy``) sets the table up
            itself through its ``score_table_options()``; an explicit ``ema`` must agree.
        device: where the score table lives; by default it follows the losses.
        num_replicas, rank, drop_last: data-parallel sharding (defaults: the process group's,
            read when an epoch is planned, so the wrapper may be built before ``init_process_group``).
        process_group: the data-parallel group whose scores are merged (default: the world).
        shard: ``True`` (default): each rank serves its own shard of the plan, as a
            ``DistributedSampler`` does. ``False``: every rank serves the whole plan
            (identical on every rank) and the framework shards the batches, as
            accelerate does; scores are still merged across the group.
        shard_scores: ``True``: each rank holds the scores and plan of its own slice of the
            index space (the indices ``i % world == rank``), O(N / world) memory instead of
            O(N), and serves the kept samples it owns; the plans are the unsharded ones. The
            world and rank must be known when the wrapper is built. Per-rank state dicts:
            :mod:`leanbatch.sharded` gathers and re-shards them.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> data = TensorDataset(torch.randn(64, 3), torch.randint(0, 2, (64,)))
        >>> ds = InfoBatch(data, num_epochs=3, prune_ratio=0.5, delta=0.67, seed=0)
        >>> model = torch.nn.Linear(3, 2)
        >>> loader = DataLoader(ds, batch_size=16, sampler=ds.sampler)
        >>> for epoch in range(3):
        ...     ds.set_epoch(epoch)
        ...     for x, y in loader:
        ...         loss = ds.update(F.cross_entropy(model(x), y, reduction="none"))
        ...         loss.backward()
        >>> [(s["pruning"], s["kept"] < 64) for s in ds.epoch_stats]   # 0: nothing scored; 2: annealing
        [(False, False), (True, True), (False, False)]
        >>> ds.get_pruned_count() == 64 - ds.epoch_stats[1]["kept"], ds.progress
        (True, 1.0)
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
        process_group: Any = None,
        shard: bool = True,
        shard_scores: bool = False,
    ):
        n = _dataset_length(dataset)
        policy_obj = _make_policy(policy, prune_ratio, num_epochs, delta)
        self.dataset = dataset
        self.prune_ratio = prune_ratio
        self.delta = delta
        options = dict(getattr(policy_obj, "score_table_options", dict)())
        if ema is not None:
            options["ema"] = ema  # the policy's bind() refuses a table it cannot rank by
        if shard_scores:
            world, r = table_slice(n, num_replicas, rank, process_group)
            options.update(world=world, rank=r)
            num_replicas, rank = world, r
        self.scores = ScoreTable(n, device=device, **options)
        self.sampler = PrunedSampler(
            self.scores,
            policy_obj,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            drop_last=drop_last,
            process_group=process_group,
            shard=shard,
            num_epochs=num_epochs,
            shard_scores=shard_scores,
        )
        self.sampler.record.fetches.track()

    @property
    def record(self) -> TrainingRecord:
        """What has been trained: the position, the epochs, the ledger (see :class:`~leanbatch.record.TrainingRecord`)."""
        return self.sampler.record

    @property
    def num_epochs(self) -> int:
        """The run's length in epochs (the training record owns it; the policy agrees with it)."""
        return self.sampler.record.num_epochs

    # ------------------------------------------------------------------ dataset
    def __len__(self) -> int:
        return self.scores.num_samples

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A whole batch's items (the DataLoader's batched fetch); notes the batch's size.

        ``update(loss)`` without indices checks each loss against the size of the batch it
        trains, so a loss of the wrong length is an error before any score lands on a wrong
        sample.
        """
        self.sampler.record.fetches.fetched(len(indices))
        many = getattr(self.dataset, "__getitems__", None)
        return list(many(indices)) if callable(many) else [self.dataset[i] for i in indices]

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

    def update(
        self, loss: Tensor, indices: Tensor | None = None, *, positions: Tensor | None = None
    ) -> Tensor:
        """Store per-sample losses as scores and return the weighted mean loss.

        Each call is one trained batch: it moves training on by the batch's samples, and
        the batch is weighted by the plan of the epoch that served it, however far ahead
        the loader has read.

        Args:
            loss: shape (k,), one loss per sample, any float dtype, with grad.
                Not modified in place. NaN/Inf entries are not stored (counted in
                :attr:`nonfinite_count`) but still show in the returned mean.
            indices: the batch's dataset indices, shape (n,); by default the next
                ``k`` samples this wrapper's sampler served, in order.
            positions: when only some rows of the batch are trained (Selective
                Backprop), their rows in the batch, shape (k,), e.g. the
                ``positions`` that :meth:`SelectiveBackprop.select` returns. ``loss[j]``
                is then the loss of sample ``indices[positions[j]]`` and the batch
                still counts as ``n`` trained samples. Needs ``indices`` (from the
                batch, or :meth:`next_indices` before training it).

        Returns:
            ``mean(loss * weight)``: the InfoBatch-rescaled loss to backpropagate.

        Example:
            >>> import torch
            >>> from torch.utils.data import DataLoader, TensorDataset
            >>> ds = InfoBatch(TensorDataset(torch.arange(8.0)), num_epochs=2, seed=0)
            >>> (x,) = next(iter(DataLoader(ds, batch_size=4, sampler=ds.sampler)))
            >>> idx = ds.next_indices(4)                   # the batch's dataset indices
            >>> bool(torch.equal(idx.float(), x))
            True
            >>> out = ds.update(torch.tensor([1.0, 3.0]), idx, positions=torch.tensor([0, 2]))
            >>> float(out), ds.scores.get(idx[[0, 2]]).tolist(), ds.progress   # 4 of 16 samples trained
            (2.0, [1.0, 3.0], 0.25)
        """
        loss = check_per_sample_loss(loss)
        if indices is None:
            if positions is not None:
                raise TypeError(
                    "positions= needs the batch's indices: update(loss, indices, positions=...); without "
                    "indices in the batch, take them with ds.next_indices(len(batch)) before training it"
                )
            return self._update_served(loss)
        return self._update_indexed(loss, indices, positions)

    def _update_served(self, loss: Tensor) -> Tensor:
        """``update(loss)``: the indices are the next ones the sampler served (the ledger's)."""
        k = loss.shape[0]
        record = self.sampler.record
        step = record.prepare(k, indices=True, batch=True, what="update(loss) without indices")
        assert step.indices is not None
        # padding at the epoch's end trains but does not score: its rows go to the spare slot
        self._store(_unscored(step.indices, None, step.scored, k, self.scores.num_samples), loss)
        record.commit(k, merged=True)
        w = step.plan.weights_on(loss.device)
        if w is None:
            return loss.mean()
        return (loss * w.index_select(0, step.plan.local_rows(_on(step.indices, w)))).mean()

    def _update_indexed(self, loss: Tensor, indices: Any, positions: Tensor | None) -> Tensor:
        """``update(loss, indices[, positions=])``: the batch names its dataset indices."""
        k = loss.shape[0]
        indices = check_index_tensor(indices, "indices")  # converts, or raises naming the argument
        n = indices.shape[0]
        if positions is None and n != k:
            raise ValueError(
                f"loss has {k} entries but indices has {n}: pass one loss per index, or positions= "
                "(the rows of the batch the losses belong to) for a selected subset"
            )
        if positions is not None:
            positions = _check_positions(positions, k, n)
        record = self.sampler.record
        # Distributed: the ranks gather n rows each, so n must be the batch's size on every rank
        # (gloo aborts the process on unequal sizes); checked against the batch the loader fetched.
        step = record.prepare(n, batch=record.distributed, subject="indices")  # before anything changes
        if indices.device.type == "cpu":
            # Our own copy: a caller's CPU tensor can alias memory that changes without torch
            # knowing (torch.from_numpy of a reused array), which no version check would see.
            indices = indices.clone() if indices.dtype == torch.int64 else indices.long()
        rows = indices if positions is None else _on(indices, positions).index_select(0, positions)
        w_batch = self._gather_checked(step.plan, loss.device, rows)  # before anything changes
        spare = self.scores.num_samples
        idx, scored = _unscored(rows, positions, step.scored, n, spare), loss
        if positions is not None and record.distributed:  # every rank gathers n rows, however many it kept
            idx = torch.full((n,), spare, dtype=torch.int64, device=positions.device).index_copy_(
                0, positions, idx.to(positions.device, non_blocking=True)
            )
            scored = loss.detach().float().new_zeros(n).index_copy_(0, positions, loss.detach().float())
        self._store(idx, scored)
        record.commit(n, merged=True)
        return loss.mean() if w_batch is None else (loss * w_batch).mean()

    def _store(self, indices: Tensor, losses: Tensor) -> None:
        """Store a step's scores; in a distributed run every rank stores every rank's rows (gathered)."""
        self.scores.store(indices, losses, check=False, across=True, group=self.sampler.process_group)

    def _gather_checked(self, plan: Plan, device: torch.device, rows: Tensor) -> Tensor | None:
        """The weights of ``rows`` (``None``: all 1), with the rows checked to be dataset indices.

        On CPU gathering the weights checks the range for free (the message then comes from
        ``check_indices``); elsewhere, an explicit check (asynchronous on CUDA). Sharded: the rows
        must be this rank's (asynchronous on CUDA too).
        """
        w = plan.weights_on(device)
        if self.scores.slice.world > 1:
            self._check_owned(rows)
        if w is not None and w.device.type == "cpu" and rows.device.type == "cpu":
            try:
                return w.index_select(0, plan.local_rows(rows))
            except (IndexError, RuntimeError):
                self.scores.check_indices(rows)
                raise
        self.scores.check_indices(rows)
        return None if w is None else w.index_select(0, plan.local_rows(_on(rows, w)))

    def _check_owned(self, rows: Tensor) -> None:
        """Sharded: every row is an index this rank owns (its weight lives here)."""
        sl = self.scores.slice
        msg = (
            f"with shard_scores=True rank {sl.rank} of {sl.world} trains the indices i % {sl.world} == "
            f"{sl.rank} (those its sampler serves): these indices are another rank's"
        )
        if rows.device.type == "cpu":
            if rows.numel() and not bool(sl.owns(rows).all()):
                self.scores.check_indices(rows)
                raise IndexError(msg)
        else:
            torch._assert_async(sl.owns(rows).all(), msg)

    def next_indices(self, n: int) -> Tensor:
        """The dataset indices (int64, CPU) of the next ``n`` samples to train, in serving order.

        Reads the sampler's ledger without moving training on: use it when a batch does not
        carry its indices but the loop needs them, e.g. to stack Selective Backprop, then
        ``update(loss, idx, positions=selected)``.
        """
        return self.sampler.peek(n)

    def weights(self, indices: Tensor) -> Tensor:
        """The loss weights (float32) of dataset ``indices`` in the batch trained next, on their device."""
        self.scores.check_indices(indices)
        plan = self.sampler.record.plan()
        w = plan.weights_on(indices.device)
        if w is None:
            return torch.ones(indices.shape, dtype=torch.float32, device=indices.device)
        if self.scores.slice.world > 1:
            self._check_owned(indices)
        return w[plan.local_rows(indices)]

    @property
    def epoch(self) -> int:
        """The epoch training stands in: the one being trained, or the next once it is fully trained.

        A resumed script restarts its epoch loop here: ``for epoch in range(ds.epoch, num_epochs)``.
        """
        return self.sampler.epoch

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
    def position(self) -> Position:
        """Where training stands: ``Position(epoch, trained, length)``, in the epoch's global order."""
        return self.sampler.record.position

    @property
    def progress(self) -> float:
        """Fraction of training done, counted in trained samples: (epoch + trained / length) / num_epochs."""
        return self.sampler.record.progress

    def carry_scores(self, model: Any) -> ScoreCarrier:
        """Send each step's score rows inside ``model``'s gradient all-reduce (DDP), not by an
        all-gather of their own: the same rows and table, one collective a step fewer (see
        :class:`~leanbatch.carrier.ScoreCarrier`, whose example runs one). Call it on every rank,
        after wrapping the model in ``DistributedDataParallel`` and before its first backward.

        Example:
            >>> import torch
            >>> try:
            ...     InfoBatch(range(8), num_epochs=2).carry_scores(torch.nn.Linear(1, 1))
            ... except TypeError as e:
            ...     print(str(e).split(",")[0])
            model must be the DistributedDataParallel wrapper the loop trains through
        """
        from leanbatch.carrier import carry_for

        return carry_for(self.scores, model, self.sampler.process_group)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Scores, epoch, position inside it, its plan, statistics: loads with weights_only=True."""
        return {"version": 2, "scores": self.scores.state_dict(), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where :meth:`state_dict` was taken (same dataset size, any number of ranks).

        The state is checked before anything changes: a wrong key, shape or value is a
        ``ValueError`` that names it. Version 1 states (the release before) still load.
        """
        checked = require(state, ("scores", "sampler"), "InfoBatch state_dict")
        version = checked.get("version", 1)
        if version not in (1, 2):
            raise ValueError(f"InfoBatch state_dict has version {version!r}; this leanbatch reads 1 and 2")
        sharding = self.sampler.record.sharding
        if sharding.scores_sharded and _unsharded(checked):  # cut this rank's part out
            from leanbatch.sharded import shard_state

            require(checked["scores"], ("num_samples",), "state_dict['scores']")
            if checked["scores"]["num_samples"] != self.scores.num_samples:
                raise ValueError(
                    f"state_dict is for a dataset of {checked['scores']['num_samples']} samples, this wrapper "
                    f"holds {self.scores.num_samples}: load a checkpoint made with the same dataset"
                )
            world, rank = sharding.resolve()
            checked = shard_state(dict(checked), world, rank, sharding.drop_last)
        record_state(checked["sampler"], self.scores.num_samples, self.sampler.record.sharding)  # check first
        self.scores.load_state_dict(checked["scores"])
        self.sampler.load_state_dict(checked["sampler"])


def _unsharded(state: Any) -> bool:
    """Whether an InfoBatch state was saved unsharded (or gathered)."""
    plan = state["sampler"].get("plan") if isinstance(state["sampler"], dict) else None
    return "world" not in state["scores"] and not (isinstance(plan, dict) and plan.get("shard") is not None)
