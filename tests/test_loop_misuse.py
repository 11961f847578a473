"""Misuse in a real training loop: each one trains correctly or is refused at its first occurrence.

Every loop here is written the way PyTorch's examples, Hugging Face's ``no_trainer`` scripts and
NLP pipelines write it, with a real ``DataLoader`` (in this process and with worker processes).
The losses are the samples' own dataset indices, so a score stored on the wrong sample shows.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

from leanbatch import InfoBatch

N = 96


def data(n: int = N) -> TensorDataset:
    """Items ``(x, index)``: a batch carries its own dataset indices."""
    return TensorDataset(torch.randn(n, 3, generator=torch.Generator().manual_seed(0)), torch.arange(n))


def own_loss(idx: Tensor) -> Tensor:
    """Each sample's loss is its dataset index (plus one, so none is zero)."""
    return idx.float() + 1.0


class Bucketing(Sampler[list[int]]):
    """The NLP batch sampler: a few batches' worth of the sampler's indices, sorted, cut into batches."""

    def __init__(self, sampler: Sampler[int], batch_size: int, pool: int = 3):
        self.sampler, self.batch_size, self.pool = sampler, batch_size, pool

    def __iter__(self) -> Iterator[list[int]]:
        chunk: list[int] = []
        for i in self.sampler:
            chunk.append(i)
            if len(chunk) == self.batch_size * self.pool:
                yield from self._cut(chunk)
                chunk = []
        yield from self._cut(chunk)

    def _cut(self, chunk: list[int]) -> Iterator[list[int]]:
        chunk = sorted(chunk)  # by "length": here the index itself
        for k in range(0, len(chunk), self.batch_size):
            yield chunk[k : k + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers, context", [(0, None), (2, None), (1, "spawn")])
def test_a_batch_sampler_that_regroups_the_served_indices_is_refused_at_the_first_batch(
    workers: int, context: str | None
) -> None:
    """In this process, in forked workers, and in a spawned worker (which gets the keys' pipe when the
    DataLoader pickles the dataset for it)."""
    ds = InfoBatch(data(), num_epochs=2, seed=0)
    loader = DataLoader(
        ds, batch_sampler=Bucketing(ds.sampler, 16), num_workers=workers, multiprocessing_context=context
    )
    batches = iter(loader)
    _, idx = next(batches)
    with pytest.raises(ValueError, match=r"update\(loss, indices\)"):
        ds.update(own_loss(idx))
    assert ds.position.trained == 0 and ds.scores.num_scored() == 0


def test_a_batch_sampler_that_regroups_the_served_indices_trains_right_with_the_indices() -> None:
    ds = InfoBatch(data(), num_epochs=2, seed=0)
    loader = DataLoader(ds, batch_sampler=Bucketing(ds.sampler, 16))
    for _, idx in loader:
        ds.update(own_loss(idx), idx)
    assert ds.epoch == 1
    assert torch.equal(ds.scores.get(torch.arange(N)), own_loss(torch.arange(N)))


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffle_true_without_the_sampler_is_refused_with_the_indices_too(workers: int) -> None:
    ds = InfoBatch(data(), num_epochs=2, seed=0)
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)
    _, idx = next(iter(loader))
    with pytest.raises(RuntimeError, match=r"sampler=ds\.sampler \(not shuffle=True"):
        ds.update(own_loss(idx), idx)
    assert ds.get_pruned_count() == 0 and ds.scores.num_scored() == 0


def train_epochs(ds: InfoBatch, epochs: range, **loader: int) -> None:
    for epoch in epochs:
        ds.set_epoch(epoch)
        for _, idx in DataLoader(ds, sampler=ds.sampler, batch_size=16, **loader):
            ds.update(own_loss(idx))


def test_a_1_based_epoch_loop_is_warned_at_its_first_set_epoch() -> None:
    ds = InfoBatch(data(), num_epochs=3, seed=0)
    with pytest.warns(
        UserWarning, match=r"set_epoch\(1\) skips epoch 0, which trained nothing: epochs are 0"
    ):
        ds.set_epoch(1)
    assert ds.position.trained == 0  # warned before anything trained


def test_a_0_based_loop_whose_loader_drops_the_last_batch_is_not_warned() -> None:
    ds = InfoBatch(data(90), num_epochs=3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_epochs(ds, range(3), drop_last=True)
    assert [s["epoch"] for s in ds.epoch_stats] == [0, 1, 2]


@pytest.mark.parametrize("workers", [0, 2])
def test_len_of_the_loader_never_changes_inside_an_epoch_so_accumulation_steps_its_last_group(
    workers: int,
) -> None:
    """The ``no_trainer`` idiom: step every 4 batches or at ``step == len(loader) - 1``, after update()."""
    ds = InfoBatch(data(), num_epochs=3, prune_ratio=0.9, delta=0.67, seed=0)
    model = torch.nn.Linear(3, 1)
    loader = DataLoader(ds, sampler=ds.sampler, batch_size=16, num_workers=workers)
    per_epoch = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        steps, lengths = 0, []
        for step, (x, idx) in enumerate(loader):
            ds.update(model(x).squeeze(1) ** 2 + own_loss(idx)).backward()
            lengths.append(len(loader))
            if step % 4 == 3 or step == len(loader) - 1:
                steps += 1
        assert len(set(lengths)) == 1, f"epoch {epoch}: len(loader) changed inside it: {lengths}"
        assert steps == -(-lengths[0] // 4), f"epoch {epoch}: the last group was not stepped"
        per_epoch.append(lengths[0])
    assert per_epoch[1] < per_epoch[0] == per_epoch[2]  # the epochs differ in batches: the check bites


@pytest.mark.parametrize("workers", [0, 2])
def test_an_evaluation_pass_through_the_wrapper_mid_epoch_leaves_training_alone(workers: int) -> None:
    ds = InfoBatch(data(), num_epochs=2, seed=0)
    train = DataLoader(ds, sampler=ds.sampler, batch_size=16, num_workers=workers)
    for step, (_, idx) in enumerate(train):
        ds.update(own_loss(idx))
        if step == 2:  # train accuracy, the plain way
            for _ in DataLoader(ds, batch_size=64, num_workers=workers):
                pass
    assert ds.epoch == 1
    assert torch.equal(ds.scores.get(torch.arange(N)), own_loss(torch.arange(N)))


def test_a_second_update_for_one_batch_is_refused_at_the_first_batch() -> None:
    """A main and an auxiliary head, each with its own update(): one update per batch."""
    ds = InfoBatch(data(), num_epochs=2, seed=0)
    _, idx = next(iter(DataLoader(ds, sampler=ds.sampler, batch_size=16)))
    ds.update(own_loss(idx))
    with pytest.raises(ValueError, match="once per batch"):
        ds.update(own_loss(idx) * 2)
    assert ds.position.trained == 16 and torch.equal(ds.scores.get(idx), own_loss(idx))


def test_a_wrong_length_loss_is_refused_with_the_batch_size() -> None:
    ds = InfoBatch(data(), num_epochs=2, seed=0)
    _, idx = next(iter(DataLoader(ds, sampler=ds.sampler, batch_size=16)))
    with pytest.raises(ValueError, match="loss has 15 entries but the batch it trains has 16"):
        ds.update(own_loss(idx)[1:])


def test_update_returns_float32_for_bf16_losses_on_weighted_and_unweighted_batches() -> None:
    ds = InfoBatch(data(), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=0)
    dtypes = set()
    for epoch in range(3):
        ds.set_epoch(epoch)
        for _, idx in DataLoader(ds, sampler=ds.sampler, batch_size=16):
            dtypes.add(ds.update(own_loss(idx).to(torch.bfloat16)).dtype)
    assert ds.epoch_stats[1]["pruning"]  # epoch 1 weighted its batches
    assert dtypes == {torch.float32}


def test_torch_compile_over_a_whole_step_that_calls_update() -> None:
    """The torch 2.x pattern: one compiled function for forward, update() and backward."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    n = 100  # at 2af5e89: "modified in place" at this size, and a recompile at every step
    ds = InfoBatch(data(n), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="aot_eager")
    def step(x: Tensor, idx: Tensor) -> Tensor:
        loss = ds.update((model(x).squeeze(1) - idx.float()) ** 2)
        loss.backward()
        return loss.detach()

    for epoch in range(3):
        ds.set_epoch(epoch)
        for x, idx in DataLoader(ds, sampler=ds.sampler, batch_size=16):
            opt.zero_grad()
            assert torch.isfinite(step(x, idx))
            opt.step()
    assert ds.progress == 1.0 and ds.scores.num_scored() == n
    assert ds.epoch_stats[1]["kept"] < n
    assert counters["stats"]["unique_graphs"] <= 5  # compiled once around the break, not per step


def test_an_iterable_dataset_is_refused_naming_what_works_on_streams() -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[int]:
            return iter(range(4))

    with pytest.raises(TypeError, match="SelectiveBackprop or leanbatch.OnlineBatchSelection"):
        InfoBatch(Stream(), num_epochs=2)


def test_the_once_a_run_warnings_point_at_the_line_of_the_loop() -> None:
    """Through the wrapper (``ds.set_epoch``) and through a DataLoader (``for x in loader``), a
    warning names the loop's own line, not one of leanbatch's or torch's."""
    ds = InfoBatch(TensorDataset(torch.arange(8.0)), num_epochs=1, seed=0)
    with warnings.catch_warnings(record=True) as skip:
        warnings.simplefilter("always")
        ds.set_epoch(1)  # a 1-based loop: skips epoch 0
    assert [(w.filename, "skips epoch 0" in str(w.message)) for w in skip] == [(__file__, True)]
    ds = InfoBatch(TensorDataset(torch.arange(8.0)), num_epochs=1, seed=0)
    for (x,) in DataLoader(ds, batch_size=8, sampler=ds.sampler):
        ds.update(x)
    with warnings.catch_warnings(record=True) as past:
        warnings.simplefilter("always")
        for _ in DataLoader(ds, batch_size=8, sampler=ds.sampler):
            pass
    assert [(w.filename, "all 1 epochs" in str(w.message)) for w in past] == [(__file__, True)]
