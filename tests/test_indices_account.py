"""``update(loss, indices)`` with indices that are not the ones served: refused by the epoch's end.

The indices decide where the scores go and which weights apply, while the plan and the place in
the epoch come from the served stream, so indices that were never served (``torch.arange(len(x))``,
one batch updated twice) once stored scores on wrong samples without a word. Each iteration now
counts the indices its updates name against those it served (:mod:`leanbatch.accounts`): equal
multisets once trained to its end, a part of them when left early. Real loaders throughout, in
this process and with worker processes; the losses are the samples' own indices, so a score on
the wrong sample shows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_exactness import ahead  # batch b trained once b + 1 .. b + k are fetched
from torch import Tensor
from torch.utils.data import DataLoader, Sampler, TensorDataset

from leanbatch import InfoBatch

N = 48
BATCH = 8


def data(n: int = N) -> TensorDataset:
    """Items ``(x, index)``: a batch carries its own dataset indices."""
    return TensorDataset(torch.randn(n, 3, generator=torch.Generator().manual_seed(0)), torch.arange(n))


def own_loss(idx: Tensor) -> Tensor:
    """Each sample's loss is its dataset index plus one."""
    return idx.float() + 1.0


def wrapper(epochs: int = 3, **kw: Any) -> InfoBatch:
    return InfoBatch(data(), num_epochs=epochs, prune_ratio=0.5, delta=0.67, seed=0, **kw)


class Shuffled(Sampler[list[int]]):
    """A batch sampler that takes each epoch's served indices and regroups all of them at random."""

    def __init__(self, sampler: Sampler[int], batch_size: int):
        self.sampler, self.batch_size, self.gen = sampler, batch_size, torch.Generator().manual_seed(1)

    def __iter__(self) -> Iterator[list[int]]:
        served = list(self.sampler)
        order = torch.randperm(len(served), generator=self.gen).tolist()
        mixed = [served[i] for i in order]
        for k in range(0, len(mixed), self.batch_size):
            yield mixed[k : k + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [0, 2])
def test_indices_that_were_never_served_are_refused_by_the_end_of_the_first_epoch(workers: int) -> None:
    """The issue's loop: every batch updated with ``torch.arange(4)``, not the batch's indices."""
    ds = InfoBatch(TensorDataset(torch.arange(16.0)), num_epochs=2, prune_ratio=0.0, policy="random", seed=0)
    steps = []
    with pytest.raises(ValueError, match=r"update\(loss, indices\) was given indices that epoch 0 did not"):
        for epoch in range(2):
            for (_x,) in DataLoader(ds, batch_size=4, sampler=ds.sampler, num_workers=workers):
                steps.append(epoch)
                ds.update(torch.ones(4), torch.arange(4))
    assert steps == [0, 0, 0, 0]  # raised at epoch 0's last update
    assert ds.scores.num_scored() == 4  # what the check came too late to stop


@pytest.mark.parametrize("workers", [0, 2])
def test_one_batch_updated_twice_is_refused_by_the_end_of_the_epoch(workers: int) -> None:
    ds = wrapper()
    with pytest.raises(ValueError, match=r"named 2 times by the updates and served 1 times.*once per batch"):
        for step, (_, idx) in enumerate(
            DataLoader(ds, batch_size=BATCH, sampler=ds.sampler, num_workers=workers)
        ):
            ds.update(own_loss(idx), idx)
            if step == 1:
                ds.update(own_loss(idx), idx)  # two heads, two updates of one batch
    assert ds.position.epoch == 1


def test_indices_of_the_wrong_length_every_batch_are_refused_early_in_the_next_epoch() -> None:
    """3 of each batch's 4 indices (and 3 losses): the ledger's place drifts from the loader's batches."""
    ds = InfoBatch(TensorDataset(torch.arange(16.0), torch.arange(16)), 3, prune_ratio=0.0, policy="random")
    steps = []
    with pytest.raises(ValueError, match=r"epoch 0 did not serve.*\(before the epoch was left\)"):
        for epoch in range(3):
            for _, idx in DataLoader(ds, batch_size=4, sampler=ds.sampler):
                steps.append(epoch)
                ds.update(own_loss(idx[:3]), idx[:3])
    assert steps == [0, 0, 0, 0, 1, 1]  # epoch 0 had 4 samples left: the first of epoch 1 went there


@pytest.mark.parametrize("workers, drop_last", [(0, False), (2, False), (2, True)])
def test_a_batch_sampler_that_regroups_each_epoch_trains_right_with_the_batches_indices(
    workers: int, drop_last: bool
) -> None:
    """Any regrouping of the served indices (here all of the epoch's, at random) is the same multiset."""
    ds = wrapper()
    ds.sampler.chunk_size = 5  # served in chunks, most of them after the epoch's first update
    for epoch in range(3):
        ds.set_epoch(epoch)
        sampler = Shuffled(ds.sampler, BATCH) if not drop_last else ds.sampler
        loader = (
            DataLoader(ds, batch_size=BATCH - 1, sampler=sampler, num_workers=workers, drop_last=True)
            if drop_last
            else DataLoader(ds, batch_sampler=sampler, num_workers=workers)
        )
        for _, idx in loader:
            ds.update(own_loss(idx), idx)
    assert ds.epoch_stats[1]["pruning"] and ds.epoch_stats[1]["kept"] < N
    scored = ds.scores.get(torch.arange(N))
    seen = ~scored.isnan()
    assert torch.equal(scored[seen], own_loss(torch.arange(N))[seen]) and int(seen.sum()) >= N - BATCH


@pytest.mark.parametrize("wrong", [False, True])
def test_workers_reading_ahead_across_epochs_train_right_and_a_wrong_index_is_still_refused(
    wrong: bool,
) -> None:
    """Two workers and a consumer two batches ahead: epoch e + 1 is served before epoch e is trained;
    each update belongs to the epoch that served it, and one wrong index in epoch 1 is refused there."""
    ds = wrapper()
    ds.sampler.chunk_size = 5  # served in chunks, most of them after the epoch's first update
    loader = DataLoader(ds, batch_size=BATCH, sampler=ds.sampler, num_workers=2, prefetch_factor=2)
    epochs = itertools.chain.from_iterable(((e, b) for b in loader) for e in range(3))
    trained = []

    def run() -> None:
        for epoch, (_, idx) in ahead(epochs, 2):
            if wrong and epoch == 1 and len(trained) == 7:
                idx = (idx + 1) % N  # an id column off by one
            trained.append(epoch)
            ds.update(own_loss(idx), idx)

    if not wrong:
        run()
        assert ds.progress == 1.0 and ds.epoch_stats[1]["pruning"]
        assert torch.equal(ds.scores.get(torch.arange(N)), own_loss(torch.arange(N)))  # the last epoch: all
        return
    with pytest.raises(ValueError, match="epoch 1 did not serve"):
        run()
    assert trained.count(0) == N // BATCH and trained[-1] == 1


def test_a_resumed_epoch_checks_what_it_trains_after_the_resume_and_never_false_alarms() -> None:
    """A checkpoint in the middle of epoch 1, taken with batches read ahead, resumed in a new wrapper:
    the resumed iteration serves from the saved position, and its account starts there."""
    ds = wrapper()
    loader = DataLoader(ds, batch_size=BATCH, sampler=ds.sampler, num_workers=2)
    batches = ahead(itertools.chain.from_iterable(loader for _ in range(3)), 1)
    for _, idx in itertools.islice(batches, N // BATCH + 2):  # epoch 0, and 2 batches of epoch 1
        ds.update(own_loss(idx), idx)
    state = ds.state_dict()
    assert ds.position.epoch == 1 and ds.position.trained == 2 * BATCH
    resumed = wrapper()
    resumed.load_state_dict(state)
    for epoch in range(resumed.epoch, 3):
        resumed.set_epoch(epoch)
        for _, idx in DataLoader(resumed, batch_size=BATCH, sampler=resumed.sampler, num_workers=2):
            resumed.update(own_loss(idx), idx)
    assert resumed.progress == 1.0
    again = wrapper()
    again.load_state_dict(state)
    with pytest.raises(ValueError, match="epoch 1 did not serve"):
        for _, idx in DataLoader(again, batch_size=BATCH, sampler=again.sampler):
            again.update(own_loss(idx), torch.arange(len(idx)))


def test_an_epoch_left_early_checks_only_what_it_trained() -> None:
    """A ``break`` trains part of what was served: fine while the trained indices are part of the
    served ones; the same rows named twice are not, and are refused when the next epoch begins."""
    ds = wrapper()
    for epoch in range(3):
        ds.set_epoch(epoch)
        for step, (_, idx) in enumerate(DataLoader(ds, batch_size=BATCH, sampler=ds.sampler)):
            ds.update(own_loss(idx), idx)
            if step == 1:
                break  # evaluate, stop early: the epoch's rest is never trained
    bad = wrapper()
    for step, (_, idx) in enumerate(DataLoader(bad, batch_size=BATCH, sampler=bad.sampler)):
        bad.update(own_loss(idx), torch.arange(len(idx)))
        if step == 1:
            break
    with pytest.raises(ValueError, match=r"named 2 times.*\(before the epoch was left\)"):
        bad.set_epoch(1)


def test_a_step_budget_and_selected_rows_count_the_whole_batchs_indices() -> None:
    """``set_limit`` cuts each epoch short (the engine's budget arms); Selective Backprop trains
    some rows of each batch with ``positions=``; the indices named are still the whole batch's."""
    for wrong in (False, True):
        ds = wrapper()
        ds.sampler.set_limit(lambda epoch: [N, 20, 12][epoch])
        ds.sampler.chunk_size = 5  # served as the batches are fetched, most after the epoch's first update
        try:
            for epoch in range(3):
                ds.set_epoch(epoch)
                for _, idx in DataLoader(ds, batch_size=BATCH, sampler=ds.sampler):
                    rows = torch.arange(0, len(idx), 2)
                    named = idx if not (wrong and epoch == 2) else (idx + 1) % N
                    ds.update(own_loss(idx[rows]), named, positions=rows)
        except ValueError as e:
            assert wrong and "epoch 2 did not serve" in str(e)
        else:
            assert not wrong and ds.progress == 1.0


def _ranks_body(rank: int, out: str) -> None:
    """Each rank trains its own share (45 samples: the last round padded), plain and sharded tables;
    then both ranks name rows of the batch instead of its indices."""
    results: dict[str, Any] = {}
    for name, options in (("plain", {}), ("sharded", {"shard_scores": True})):
        ds = InfoBatch(data(45), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=0, **options)
        for epoch in range(3):
            ds.set_epoch(epoch)
            for _, idx in DataLoader(ds, batch_size=4, sampler=ds.sampler):
                ds.update(own_loss(idx), idx)
                account = ds.sampler._its[-1].account if ds.sampler._its else None
                if account is not None:  # one row per index the table holds (and the spare)
                    results[name + "_rows"] = account.served.numel()
        results[name] = (ds.progress, ds.epoch_stats[-1]["padded"], ds.epoch_stats[1]["pruning"])
    ds = InfoBatch(data(45), num_epochs=3, seed=0)
    try:
        for _, idx in DataLoader(ds, batch_size=4, sampler=ds.sampler):
            ds.update(own_loss(idx), torch.arange(len(idx)))
    except ValueError as e:
        results["wrong"] = str(e)
    ds.scores.flush()
    torch.save(results, f"{out}/rank{rank}.pt")


def test_each_rank_checks_its_own_share_plain_and_sharded_and_refuses_wrong_indices(tmp_path: Any) -> None:
    from ranks import in_process_group, spawn_ranks

    spawn_ranks(in_process_group, (2, str(tmp_path / "init"), _ranks_body, str(tmp_path)), 2)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["plain"] == (1.0, 1, True) and got["sharded"][0] == 1.0 and got["sharded"][2]
        assert got["plain_rows"] == 45 + 1 and got["sharded_rows"] == (23 if rank == 0 else 22) + 1
        assert "epoch 0 did not serve on this rank" in got["wrong"]


@pytest.mark.parametrize("fold", [3, 1 << 20])
def test_counts_folded_during_the_epoch_or_at_its_end_check_alike(fold: int, monkeypatch: Any) -> None:
    """The named indices are counted a few thousand at a time: folded mid-epoch (every 3 samples here)
    or only at the epoch's end, a right loop passes every epoch and a batch updated twice is refused."""
    from leanbatch.accounts import IndexAccount

    monkeypatch.setattr(IndexAccount, "FOLD", fold)
    ds = wrapper()
    for epoch in range(3):
        ds.set_epoch(epoch)
        for _, idx in DataLoader(ds, batch_size=BATCH, sampler=ds.sampler):
            ds.update(own_loss(idx), idx)
    assert ds.position.epoch == 3
    bad = wrapper()
    with pytest.raises(ValueError, match=r"named 2 times by the updates and served 1 times"):
        for step, (_, idx) in enumerate(DataLoader(bad, batch_size=BATCH, sampler=bad.sampler)):
            bad.update(own_loss(idx), idx)
            if step == 0:
                bad.update(own_loss(idx), idx)


def test_indices_modified_in_place_before_they_are_counted_are_refused() -> None:
    """The account keeps the indices an update named until it counts them (CPU ones are the
    wrapper's own copies; a device's are the caller's): changed in place by then, it refuses."""
    from leanbatch.accounts import IndexAccount

    account = IndexAccount(6, torch.tensor([0, 1, 2]))
    named = torch.tensor([0, 1, 2])
    account.train(named)
    named.fill_(5)
    with pytest.raises(RuntimeError, match=r"modified in place before it was counted"):
        account.close(epoch=0, whole=True)


def test_a_sharded_tables_account_counts_its_own_rows_and_names_an_index_it_does_not_own() -> None:
    """With ``owner=(world, rank)`` the counts are one per index the rank owns (O(N / world), as the
    table), plus one row for any other: an index of another rank's never lands on an owned row."""
    from leanbatch.accounts import IndexAccount

    right = IndexAccount(3, torch.tensor([0, 2, 4]), owner=(2, 0))  # rank 0 of 2 owns 0, 2, 4
    right.train(torch.tensor([4, 0, 2]))
    right.close(epoch=0, whole=True)
    assert right.served.numel() == 4
    wrong = IndexAccount(3, torch.tensor([0, 2, 4]), owner=(2, 0))
    wrong.train(torch.tensor([0, 2, 5]))  # 5 // 2 is 4's row: an off-by-one once passed as 4
    with pytest.raises(ValueError, match=r"an index this rank does not own was named 1 times"):
        wrong.close(epoch=0, whole=True)
