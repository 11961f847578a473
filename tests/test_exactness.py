"""Exact under the loaders real training uses: read-ahead, len(), resume, explicit indices.

Every loader that real training uses fetches batches before the step that trains them
(DataLoader workers, Lightning's prefetching loop, accelerate's one-batch-ahead shard).
Here a consumer trains batch b while batches b+1..b+k have already been produced, on a
dataset whose pruned epochs end on a short batch. Whatever the read-ahead, the update path
(the sampler's ledger or explicit indices), ``drop_last``, reads of ``len()``, or a
checkpoint taken after any step and resumed in a fresh process-like rebuild, training must
be exactly the uninterrupted run: the same batches, the same returned (weighted) losses,
the same scores and the same plans.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch

N, EPOCHS, BS = 240, 4, 16


def loss_of(x: torch.Tensor, epoch: int) -> torch.Tensor:
    """Losses that change over training, so every plan depends on the whole history."""
    return torch.sin(x * (epoch + 1)).abs() + 0.01


def ahead(loader: Iterable[Any], k: int) -> Iterator[Any]:
    """Yield batch b only once batches b+1..b+k have been fetched (or the loader ran out)."""
    buf: deque[Any] = deque()
    for batch in loader:
        buf.append(batch)
        if len(buf) > k:
            yield buf.popleft()
    while buf:
        yield buf.popleft()


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


class Run:
    """A training script: build, (resume), then the epoch loop of an ordinary user."""

    def __init__(self, k: int, explicit: bool, drop_last: bool, workers: int = 0, read_len: bool = False):
        self.k, self.explicit, self.drop_last, self.workers, self.read_len = (
            k,
            explicit,
            drop_last,
            workers,
            read_len,
        )

    def build(self) -> tuple[InfoBatch, DataLoader]:
        data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
        ds = InfoBatch(data, EPOCHS, prune_ratio=0.6, delta=0.75, seed=11)
        loader = DataLoader(
            ds,
            batch_size=BS,
            sampler=ds.sampler,
            drop_last=self.drop_last,
            num_workers=self.workers,
            persistent_workers=self.workers > 0,
        )
        return ds, loader

    def __call__(self, stop_at: int | None = None) -> tuple[list[tuple], InfoBatch, list[float]]:
        ds, loader = self.build()
        log: list[tuple] = []
        progress: list[float] = []
        step = 0
        epoch = 0
        while epoch < EPOCHS:
            ds.set_epoch(epoch)
            resumed = False
            for x, i in ahead(loader, self.k):
                if self.read_len:
                    len(loader), len(ds.sampler)  # user code reads lengths at any moment
                loss = loss_of(x, epoch)
                out = ds.update(loss, i) if self.explicit else ds.update(loss)
                log.append((epoch, i.tolist(), round(float(out), 6)))
                progress.append(ds.progress)
                step += 1
                if step == stop_at:
                    state = roundtrip(ds.state_dict())
                    ds, loader = self.build()
                    ds.load_state_dict(state)
                    resumed = True
                    break
            if resumed:
                epoch = ds.epoch  # a resumed script restarts its epoch loop where training stands
                continue
            epoch += 1
        return log, ds, progress


def oracle() -> tuple[list[tuple], list[dict]]:
    """The run computed independently of the update path: each batch's expected output is the
    mean of its losses times the weights of the plan that served it, read from the sampler
    right after that epoch's iteration started (no read-ahead, nothing else read)."""
    data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
    ds = InfoBatch(data, EPOCHS, prune_ratio=0.6, delta=0.75, seed=11)
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    log = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        plan = None
        for x, i in loader:
            plan = plan or ds.sampler.plan()
            loss = loss_of(x, epoch)
            w = torch.ones(len(i)) if plan.weights is None else plan.weights[i]
            log.append((epoch, i.tolist(), round(float((loss * w).mean()), 6)))
            ds.scores.update(i, loss)
    return log, ds.epoch_stats


@pytest.fixture(scope="module")
def reference() -> dict[bool, tuple[list[tuple], list[dict], torch.Tensor]]:
    out = {}
    for drop_last in (False, True):
        log, ds, _ = Run(0, False, drop_last)()
        out[drop_last] = (log, ds.epoch_stats, ds.scores.values.clone())
    return out


def test_the_reference_run_is_the_oracle_and_prunes_with_short_last_batches(reference):
    log, stats, _ = reference[False]
    expected_log, expected_stats = oracle()
    assert log == expected_log
    assert stats == expected_stats
    pruned = [s for s in stats if s["pruning"] and s["kept"] < N]
    assert len(pruned) >= 2 and all(s["kept"] % BS for s in pruned)  # pruned epochs end on a short batch


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("explicit", [False, True], ids=["ledger", "explicit"])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_read_ahead_and_len_reads_change_nothing(reference, k, explicit, drop_last):
    ref_log, ref_stats, ref_scores = reference[drop_last]
    for read_len in (False, True):
        log, ds, progress = Run(k, explicit, drop_last, read_len=read_len)()
        assert log == ref_log
        assert ds.epoch_stats == ref_stats  # same thresholds, same plans
        assert torch.equal(ds.scores.values, ref_scores)
        assert progress == sorted(progress) and progress[-1] <= 1.0


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("explicit", [False, True], ids=["ledger", "explicit"])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_resume_after_every_step_reproduces_the_run(reference, k, explicit, drop_last):
    ref_log, ref_stats, ref_scores = reference[drop_last]
    run = Run(k, explicit, drop_last, read_len=k == 2)
    wrong = []
    for stop in range(1, len(ref_log) + 1):
        log, ds, _ = run(stop_at=stop)
        if log != ref_log or ds.epoch_stats != ref_stats or not torch.equal(ds.scores.values, ref_scores):
            wrong.append(stop)
    assert wrong == [], f"{len(wrong)} of {len(ref_log)} stop steps resume wrongly: {wrong}"


@pytest.mark.parametrize("explicit", [False, True], ids=["ledger", "explicit"])
def test_resume_after_every_step_with_worker_processes(reference, explicit):
    ref_log, ref_stats, ref_scores = reference[False]
    run = Run(2, explicit, False, workers=2)
    stops = range(1, len(ref_log) + 1)
    for stop in stops:
        log, ds, _ = run(stop_at=stop)
        assert log == ref_log, f"stopped at step {stop}"
        assert ds.epoch_stats == ref_stats and torch.equal(ds.scores.values, ref_scores)


def test_progress_counts_trained_samples_not_fetched_ones():
    data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
    ds = InfoBatch(data, EPOCHS, prune_ratio=0.6, delta=0.75, seed=11)
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        trained = 0
        for x, i in ahead(loader, 3):
            length = len(ds.sampler)
            assert ds.progress == pytest.approx((epoch + trained / length) / EPOCHS)
            ds.update(loss_of(x, epoch), i)
            trained += len(i)
        assert ds.progress == pytest.approx((epoch + 1) / EPOCHS)
    assert ds.progress == 1.0


def test_a_batch_is_weighted_by_the_plan_of_the_epoch_that_served_it_across_chained_epochs():
    """A consumer that chains epochs and reads ahead across the boundary: the next epoch's
    iteration starts before the last batches of the previous one are trained."""
    data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
    ds = InfoBatch(data, EPOCHS, prune_ratio=0.6, delta=0.75, seed=11)
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    plans = {}

    def epochs():
        for e in range(EPOCHS):
            for b in loader:
                plans.setdefault(e, ds.sampler.plan())
                yield e, b

    seen = 0
    for e, (_x, i) in ahead(epochs(), 2):
        loss = torch.full((len(i),), 1.0)
        out = ds.update(loss, i)
        w = plans[e].weights
        expected = 1.0 if w is None else float(w[i].mean())
        assert float(out) == pytest.approx(expected)
        seen += len(i)
    assert seen == sum(s["kept"] for s in ds.epoch_stats)
