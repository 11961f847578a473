"""Where real training runs hurt: workers, spawn, persistent workers, collate_fn,
drop_last, and consumers that fetch batches ahead of the step that trains them.

Every item carries its dataset index only so the test can check alignment: the
loss of item i is i / N, so after an epoch score[i] must be i / N for every
sample served, whatever the loader did.
"""

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch

N = 300


def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))


def collate_pairs(items):
    """A custom collate_fn: must receive the user's (x, i) items unchanged."""
    assert all(isinstance(it, tuple) and len(it) == 2 for it in items)
    xs, idx = zip(*items, strict=True)
    return {"x": torch.stack(xs), "i": torch.stack(idx)}


def check_epoch(ds, batches, served):
    for b in batches:
        x, i = (b["x"], b["i"]) if isinstance(b, dict) else b
        served.extend(i.tolist())
        ds.update((x / N).requires_grad_())
    values = ds.scores.values
    assert torch.allclose(values[served], torch.tensor(served, dtype=torch.float32) / N)


def train(ds, loader, epochs=3):
    counts = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        served: list[int] = []
        check_epoch(ds, loader, served)
        assert len(served) == len(set(served))
        counts.append(len(served))
    return counts


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=0),
        dict(num_workers=2),
        dict(num_workers=2, persistent_workers=True, prefetch_factor=4),
        dict(num_workers=2, multiprocessing_context="spawn", collate_fn=collate_pairs),
        dict(num_workers=0, drop_last=True),
        dict(num_workers=2, drop_last=True, collate_fn=collate_pairs),
    ],
    ids=["inline", "workers", "persistent", "spawn+collate", "drop_last", "workers+drop_last"],
)
def test_loader_configurations_keep_scores_aligned(kwargs):
    ds = InfoBatch(dataset(), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=0)
    loader = DataLoader(ds, batch_size=32, sampler=ds.sampler, **kwargs)
    counts = train(ds, loader)
    assert counts[1] < N  # epoch 1 pruned
    expected = [s["kept"] for s in ds.epoch_stats]
    if kwargs.get("drop_last"):
        expected = [k // 32 * 32 for k in expected]
    assert counts == expected


class OneAhead:
    """Fetches the next batch before the current one is trained (Lightning's prefetching
    loop, accelerate's DataLoaderShard)."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        it = iter(self.loader)
        try:
            nxt = next(it)
        except StopIteration:
            return
        for b in it:
            cur, nxt = nxt, b
            yield cur
        yield nxt


def test_prefetching_consumer_stays_aligned():
    ds = InfoBatch(dataset(), num_epochs=4, prune_ratio=0.5, delta=0.75, seed=2)
    loader = DataLoader(ds, batch_size=16, sampler=ds.sampler, num_workers=2, prefetch_factor=3)
    counts = train(ds, OneAhead(loader), epochs=4)
    assert counts[1] < N and counts[3] == N


def test_consumer_that_chains_epochs_and_prefetches_across_the_boundary():
    """An infinite iterator over epochs, one batch ahead: the next epoch's iteration starts
    before the last batch of the previous one is trained."""
    ds = InfoBatch(dataset(), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=3)
    loader = DataLoader(ds, batch_size=20, sampler=ds.sampler, drop_last=True)
    served: list[int] = []
    stream = OneAhead(itertools.chain.from_iterable(loader for _ in range(3)))
    check_epoch(ds, stream, served)
    assert [s["epoch"] for s in ds.epoch_stats] == [0, 1, 2]
    assert len(served) == sum(s["kept"] // 20 * 20 for s in ds.epoch_stats)


def test_breaking_out_of_an_epoch_then_continuing():
    ds = InfoBatch(dataset(), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=4)
    loader = DataLoader(ds, batch_size=25, sampler=ds.sampler, num_workers=2)
    ds.set_epoch(0)
    served: list[int] = []
    for k, (x, i) in enumerate(loader):
        served.extend(i.tolist())
        ds.update(x / N)
        if k == 3:
            break  # abandoned with batches prefetched by the workers
    ds.set_epoch(1)
    check_epoch(ds, loader, served)
