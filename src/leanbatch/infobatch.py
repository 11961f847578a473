"""``InfoBatch``: the drop-in dataset wrapper (Qin et al., ICLR 2024).

Three changes to a training loop: wrap the dataset, pass ``sampler=ds.sampler`` to the
DataLoader, and return ``ds.update(per_sample_loss)`` as the loss. The batches stay the user's
own items; no torch internals are patched. The wrapper is the user's face of the run its
:class:`~leanbatch.PrunedSampler` owns: it builds the score table and the sampler, fetches the
items, and turns each batch's losses into scores and the weighted loss.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from leanbatch.checks import (
    check_index_tensor,
    check_map_dataset,
    check_per_sample_loss,
    check_positions,
    require,
)
from leanbatch.policies.base import Policy
from leanbatch.policies.infobatch import make_policy
from leanbatch.policies.plan import Plan
from leanbatch.progress import Position
from leanbatch.sampler import PrunedSampler
from leanbatch.sampler_state import read_state
from leanbatch.scores import ScoreTable

if TYPE_CHECKING:
    from leanbatch.distributed.carrier import ScoreCarrier

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
            :mod:`leanbatch.distributed.checkpoints` gathers and re-shards them.

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
        n = check_map_dataset(dataset)
        policy_obj = make_policy(policy, prune_ratio, num_epochs, delta)
        self.dataset = dataset
        options = dict(getattr(policy_obj, "score_table_options", dict)())
        if ema is not None:
            options["ema"] = ema  # the policy's bind() refuses a table it cannot rank by
        self.scores: ScoreTable
        if shard_scores:  # each rank holds its slice (leanbatch.distributed, loaded only then)
            from leanbatch.distributed.shards import ShardedScores, shard_of

            num_replicas, rank = shard_of(n, num_replicas, rank, process_group)
            self.scores = ShardedScores(n, num_replicas, rank, device=device, **options)
        else:
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
        self.sampler.fetches.track()  # before any DataLoader worker starts

    @property
    def num_epochs(self) -> int:
        """The run's length in epochs (the sampler owns it; the policy agrees with it)."""
        return self.sampler.num_epochs

    # ------------------------------------------------------------------ dataset
    def __len__(self) -> int:
        return self.scores.num_samples

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A whole batch's items (the DataLoader's batched fetch); notes which batch it was.

        ``update(loss)`` without indices checks each loss against the batch it trains (its size,
        first and last index), so a loss of the wrong length, a second update of one batch or a
        batch sampler that regroups the served indices is an error before any score lands on a
        wrong sample.
        """
        self.sampler.fetches.fetched(indices)
        many = getattr(self.dataset, "__getitems__", None)
        return list(many(indices)) if callable(many) else [self.dataset[i] for i in indices]

    if not TYPE_CHECKING:  # hidden from type checkers: a misspelt ``ds.updte(...)`` is their error

        def __getattr__(self, name: str) -> Any:
            # Delegate unknown attributes to the wrapped dataset (e.g. .classes), but never
            # while unpickling or for dunder lookups: that is what makes the official wrapper
            # recurse forever under spawn and deepcopy.
            inner = self.__dict__.get("dataset")
            if not name.startswith("__") and inner is not None:
                try:
                    return getattr(inner, name)
                except AttributeError:
                    pass
            raise AttributeError(
                f"'InfoBatch' object has no attribute {name!r}, nor has the dataset it wraps "
                f"({type(inner).__name__})"
            )

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
            ``mean(loss * weight)``: the InfoBatch-rescaled loss to backpropagate, reduced in
            float32 (fp16 and bf16 losses come back as float32); a graph break inside ``torch.compile``.

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
        if torch.compiler.is_compiling():  # a compiled step: run the bookkeeping eagerly (graph break)
            return _eager_update(self, loss, indices, positions)
        if type(loss) is not Tensor or loss.dim() != 1 or not loss.is_floating_point():
            loss = check_per_sample_loss(loss)  # the full check, with the message that names the fix
        if indices is not None:
            return _update_indexed(self.sampler, loss, indices, positions)
        if positions is not None:
            raise TypeError(
                "positions= needs the batch's indices: update(loss, indices, positions=...); without "
                "indices in the batch, take them with ds.next_indices(len(batch)) before training it"
            )
        return _update_served(self.sampler, loss)

    def next_indices(self, n: int) -> Tensor:
        """The dataset indices (int64, CPU) of the next ``n`` samples to train, in serving order.

        Reads the sampler's ledger without moving training on: use it when a batch does not
        carry its indices but the loop needs them, e.g. to stack Selective Backprop, then
        ``update(loss, idx, positions=selected)``.
        """
        step = self.sampler.prepare(n, indices=True, what="next_indices()")
        assert step.indices is not None
        return step.indices

    def weights(self, indices: Tensor) -> Tensor:
        """The loss weights (float32) of dataset ``indices`` in the batch trained next, on their device."""
        self.scores.check_indices(indices)
        plan = self.sampler.plan()
        w = plan.weights_on(indices.device)
        if w is None:
            return torch.ones(indices.shape, dtype=torch.float32, device=indices.device)
        self.scores.check_owned(indices)
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
        return self.sampler.position

    @property
    def progress(self) -> float:
        """Fraction of training done, counted in trained samples: (epoch + trained / length) / num_epochs."""
        return self.sampler.progress

    def carry_scores(self, model: Any) -> ScoreCarrier:
        """Send each step's score rows inside ``model``'s gradient all-reduce (DDP), not by an
        all-gather of their own: the same rows and table, one collective a step fewer (see
        :class:`~leanbatch.distributed.ScoreCarrier`, whose example runs one). Call it on every rank,
        after wrapping the model in ``DistributedDataParallel`` and before its first backward.

        Example:
            >>> import torch
            >>> try:
            ...     InfoBatch(range(8), num_epochs=2).carry_scores(torch.nn.Linear(1, 1))
            ... except TypeError as e:
            ...     print(str(e).split(",")[0])
            model must be the DistributedDataParallel wrapper the loop trains through
        """
        return self.sampler.exchange.carry(model)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Scores, epoch, position inside it, its plan, statistics: loads with weights_only=True."""
        return {"version": 2, "scores": self.scores.state_dict(), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where :meth:`state_dict` was taken (same dataset size, any number of ranks).

        The state is checked before anything changes: a wrong key, shape or value is a
        ``ValueError`` that names it. With ``shard_scores=True`` an unsharded (or gathered) state
        is cut to this rank's part (:func:`leanbatch.distributed.shard_state`).
        """
        checked = require(state, ("version", "scores", "sampler"), "InfoBatch state_dict")
        if checked["version"] != 2:
            raise ValueError(
                f"InfoBatch state_dict has version {checked['version']!r}; this leanbatch reads 2"
            )
        if self.scores.owner is not None:  # an unsharded (gathered) state: this rank's part of it
            from leanbatch.distributed.checkpoints import own_part

            checked = own_part(checked, self.scores, self.sampler.drop_last)  # type: ignore[arg-type]
        read_state(checked["sampler"], self.scores, self.sampler.limit)  # checked before the table changes
        self.scores.load_state_dict(checked["scores"])
        self.sampler.load_state_dict(checked["sampler"])


@torch.compiler.disable
def _eager_update(ds: InfoBatch, loss: Tensor, indices: Tensor | None, positions: Tensor | None) -> Tensor:
    """:meth:`InfoBatch.update`, run eagerly from inside ``torch.compile``: the ledger and the score
    table are host-side state that a graph must not capture."""
    return ds.update(loss, indices, positions=positions)


def _update_served(sampler: PrunedSampler, loss: Tensor) -> Tensor:
    """``update(loss)``: ``loss`` belongs to the next ``len(loss)`` samples ``sampler`` served."""
    k = loss.shape[0]
    plan, idx, scored, _, _ = sampler.take(k, gathered=True)  # checked against the batch the loader fetched
    assert idx is not None
    sampler.store(idx if scored >= k else _unscored(idx, None, scored, k, sampler.scores.num_samples), loss)
    w = plan.weights_on(loss.device)
    return _weighted_mean(loss, None if w is None else w.index_select(0, plan.local_rows(_on(idx, w))))


def _update_indexed(sampler: PrunedSampler, loss: Tensor, indices: Any, positions: Tensor | None) -> Tensor:
    """``update(loss, indices[, positions=])``: the batch names its dataset indices; ``positions``
    are the batch's rows that ``loss`` belongs to (a selected subset)."""
    k = loss.shape[0]
    if type(indices) is not Tensor or indices.dtype is not torch.int64 or indices.dim() != 1:
        indices = check_index_tensor(indices, "indices")  # converts, or raises naming the argument
    n = indices.shape[0]
    if positions is None and n != k:
        raise ValueError(
            f"loss has {k} entries but indices has {n}: pass one loss per index, or positions= "
            "(the rows of the batch the losses belong to) for a selected subset"
        )
    if positions is not None:
        positions = check_positions(positions, k, n)
    distributed = sampler.distributed  # the ranks gather n rows each: n is checked to be the batch's
    step = sampler.prepare(n, batch=distributed)  # checked before anything changes
    plan, scored = step.plan, step.scored
    if indices.is_cpu:
        # our own copy: a caller's can alias memory that changes unseen (torch.from_numpy)
        indices = indices.clone() if indices.dtype is torch.int64 else indices.long()
    rows = indices if positions is None else _on(indices, positions).index_select(0, positions)
    w = _gather_checked(sampler.scores, plan, loss.device, rows)  # before anything changes
    spare = sampler.scores.num_samples
    idx = rows if scored >= n else _unscored(rows, positions, scored, n, spare)
    if positions is not None and distributed:  # every rank gathers n rows, however many it kept
        rows_on = idx.to(positions.device, non_blocking=True)
        idx = torch.full((n,), spare, dtype=torch.int64, device=positions.device).index_copy_(
            0, positions, rows_on
        )
        scores = loss.detach().float().new_zeros(n).index_copy_(0, positions, loss.detach().float())
        sampler.store(idx, scores)
    else:
        sampler.store(idx, loss)
    sampler.commit(step, gathered=True, indices=indices)  # checked against those served at the epoch's end
    return _weighted_mean(loss, w)


def _weighted_mean(loss: Tensor, w: Tensor | None) -> Tensor:
    """``mean(loss * w)`` (``w=None``: all 1), reduced in float32 at least: fp16 and bf16 losses come
    back as float32, so a weighted batch overflows no earlier than ``loss.mean()`` does. ``w`` is the
    batch's weights just gathered: scaled in place.

    Example:
        >>> half = torch.tensor([48_000.0, 48_000.0], dtype=torch.float16)
        >>> out = _weighted_mean(half, torch.tensor([1.0, 2.0]))
        >>> float(out), out.dtype, float((half * torch.tensor([1.0, 2.0]).half()).mean())
        (72000.0, torch.float32, inf)
    """
    wide = loss if loss.dtype.itemsize >= 4 else loss.float()
    if w is None:
        return wide.mean()
    k = wide.shape[0]
    if k and wide.dtype is torch.float32:  # one dot product: two autograd nodes fewer than mean(loss * w)
        return torch.dot(wide, w.mul_(_reciprocal(k)))
    return (wide * w).mean()


@functools.lru_cache(maxsize=64)
def _reciprocal(k: int) -> Tensor:
    """``1 / k`` as a 0-dim CPU tensor, made once per batch size (a Python scalar in an op costs more)."""
    return torch.tensor(1.0 / k)


def _gather_checked(table: ScoreTable, plan: Plan, device: torch.device, rows: Tensor) -> Tensor | None:
    """The weights of ``rows`` (``None``: all 1), with the rows checked to be dataset indices.

    On CPU gathering the weights checks the range for free (the message then comes from
    ``check_indices``); elsewhere, an explicit check (asynchronous on CUDA). Sharded: the rows
    must be this rank's (asynchronous on CUDA too).
    """
    w = plan.weights_on(device)
    table.check_owned(rows)
    if w is not None and w.is_cpu and rows.is_cpu:
        try:
            return w.index_select(0, plan.local_rows(rows))
        except (IndexError, RuntimeError):
            table.check_indices(rows)
            raise
    table.check_indices(rows)
    return None if w is None else w.index_select(0, plan.local_rows(_on(rows, w)))


def _unscored(rows: Tensor, positions: Tensor | None, scored: int, n: int, spare: int) -> Tensor:
    """``rows`` with those past the first ``scored`` rows of the batch sent to the spare slot (padding).

    Example:
        >>> _unscored(torch.tensor([4, 5, 6]), None, scored=2, n=3, spare=9).tolist()
        [4, 5, 9]
    """
    if scored >= n:
        return rows
    if positions is None:
        rows = rows.clone()
        rows[scored:] = spare
        return rows
    return torch.where(positions < scored, rows, spare)


def _on(idx: Tensor, like: Tensor) -> Tensor:
    """``idx`` on ``like``'s device (asynchronously)."""
    return idx if idx.device == like.device else idx.to(like.device, non_blocking=True)
