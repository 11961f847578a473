"""``PrunedSampler.set_limit``: an epoch's cut, the samples each rank serves in it (the engine's step
and batch budgets are this setting of the one sampler). Exact served counts per epoch and rank, the
cut a prefix of each rank's uncut share, a resume inside a cut epoch, bad limits; and the engine's
wrapper around it (``CountedInfoBatch(budget=...)``) under real torch.distributed: every rank serves
and trains as many samples and steps, so no rank waits at a step's collective."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from ranks import in_process_group, spawn_ranks
from torch.utils.data import DataLoader

from leanbatch import InfoBatch, PrunedSampler, RandomPolicy, ScoreTable
from leanbatch.engine.running.data import Budget, CountedInfoBatch

N, WORLD, EPOCHS = 23, 3, 3
CUTS = [8, 5, 0]  # 8 is each rank's whole share (ceil(23 / 3)): no cut


def _sampler(rank: int, limit: list[int] | None, seed: int = 0) -> PrunedSampler:
    s = PrunedSampler(ScoreTable(N), RandomPolicy(0.0, EPOCHS), seed=seed, num_replicas=WORLD, rank=rank)
    if limit is not None:
        s.set_limit(lambda epoch: limit[epoch])
    return s


def _epochs(s: PrunedSampler) -> list[list[int]]:
    """Each epoch's served indices, the samples marked trained as served (one batch an epoch)."""
    out = []
    for epoch in range(EPOCHS):
        s.set_epoch(epoch)
        served = list(s)
        if served:
            s.take(len(served))
        out.append(served)
    return out


def test_a_limit_serves_the_first_samples_of_every_ranks_share_and_as_many_on_every_rank() -> None:
    cut = {r: _epochs(_sampler(r, CUTS)) for r in range(WORLD)}
    whole = {r: _epochs(_sampler(r, None)) for r in range(WORLD)}
    for r in range(WORLD):
        assert [len(e) for e in cut[r]] == CUTS  # exactly the limit, on every rank
        assert [len(e) for e in whole[r]] == [8, 8, 8]
        for epoch in range(EPOCHS):  # the first samples of the rank's uncut share: the same order
            assert cut[r][epoch] == whole[r][epoch][: CUTS[epoch]]
    assert {i for r in range(WORLD) for i in cut[r][0]} == set(range(N))  # all of epoch 0 (1 padded)
    epoch1 = [i for r in range(WORLD) for i in cut[r][1]]
    assert len(set(epoch1)) == len(epoch1) == 15  # 5 each, no sample on two ranks
    assert cut[0][0] != cut[0][1]  # a fresh order each epoch


def test_the_cut_is_a_pure_function_of_seed_epoch_rank_and_limit() -> None:
    assert _epochs(_sampler(1, CUTS)) == _epochs(_sampler(1, CUTS))
    assert _epochs(_sampler(1, CUTS, seed=1))[0] != _epochs(_sampler(1, CUTS))[0]
    s = _sampler(2, [4, 4, 4])
    assert len(s) == 4 and len(list(s)) == 4  # len() before iter() knows the cut


@pytest.mark.parametrize("rank", range(WORLD))
def test_a_resume_inside_a_cut_epoch_serves_the_rest_of_it(rank: int) -> None:
    limit = [8, 5, 3]
    straight = _epochs(_sampler(rank, limit))
    first = _sampler(rank, limit)
    first.take(len(list(first)))  # epoch 0, whole
    served = list(first)
    first.take(2)  # 2 of epoch 1's 5
    state = first.state_dict()
    resumed = _sampler(rank, limit)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and len(resumed) == 3
    rest = list(resumed)
    assert served[:2] + rest == straight[1]  # the rest of the cut epoch, in order
    resumed.take(len(rest))
    assert resumed.epoch == 2 and list(resumed) == straight[2]


def test_a_resumed_wrapper_with_a_cut_trains_what_the_uninterrupted_one_trains() -> None:
    data = torch.arange(40.0)

    def wrapper() -> InfoBatch:
        ds = InfoBatch(data, 2, 0.0, policy="random", seed=3)
        ds.sampler.set_limit(lambda epoch: [40, 14][epoch])
        return ds

    def trained(ds: InfoBatch, stop: int | None = None) -> list[float]:
        out: list[float] = []
        loader = DataLoader(ds, batch_size=4, sampler=ds.sampler)
        for epoch in range(ds.epoch, 2):
            ds.set_epoch(epoch)
            for x in loader:
                if stop is not None and len(out) == stop:
                    return out
                ds.update(torch.ones(len(x)))
                out += x.tolist()
        return out

    straight = trained(wrapper())
    assert len(straight) == 40 + 14 and wrapper().sampler.epoch_length() == 40
    first = wrapper()
    head = trained(first, stop=48)  # inside epoch 1: 8 of its 14 trained
    resumed = wrapper()
    resumed.load_state_dict(first.state_dict())
    assert resumed.epoch == 1 and len(resumed.sampler) == 6
    assert head + trained(resumed) == straight and resumed.epoch == 2 and resumed.progress == 1.0


def test_a_state_saved_with_a_cut_is_refused_without_one_and_the_reverse_before_anything_changes() -> None:
    """The cut is code, not saved: a resume that forgets ``set_limit`` would serve whole epochs (more
    than the budget) without a word, and one that adds it would cut a state saved uncut."""
    data = torch.arange(40.0)
    cut = InfoBatch(data, 2, 0.0, policy="random", seed=3)
    cut.sampler.set_limit(lambda epoch: [40, 14][epoch])
    for _ in DataLoader(cut, batch_size=4, sampler=cut.sampler):
        cut.update(torch.ones(4))
    whole = InfoBatch(data, 2, 0.0, policy="random", seed=3)
    with pytest.raises(
        ValueError, match=r"saved by a sampler whose epochs were cut \(set_limit\).*call set_limit"
    ):
        whole.load_state_dict(cut.state_dict())
    assert whole.epoch == 0 and whole.scores.values.isnan().all()  # nothing of the refused state loaded
    with pytest.raises(ValueError, match=r"saved by a sampler that served whole epochs"):
        cut.sampler.load_state_dict(whole.sampler.state_dict())
    whole.sampler.set_limit(lambda epoch: [40, 14][epoch])
    whole.load_state_dict(cut.state_dict())  # the same limit set again: resumes
    assert whole.epoch == 1 and len(whole.sampler) == 14


@pytest.mark.parametrize("bad", [-1, 2.5, True, None])
def test_a_limit_that_is_no_count_is_refused_naming_it(bad: object) -> None:
    s = _sampler(0, None)
    s.set_limit(lambda epoch: bad)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match=r"limit\(0\) must be an int >= 0 \(the samples each rank serves\)"):
        list(s)
    with pytest.raises(TypeError, match="limit must be None or a function of the epoch"):
        s.set_limit(5)  # type: ignore[arg-type]
    s.set_limit(None)
    assert len(list(s)) == 8  # no cut again


def test_a_budget_arm_serves_its_share_of_steps_exactly() -> None:
    # 50 samples, 3 epochs, batches of 4: 13 steps an epoch; half of 39 steps is 20 (halves up):
    # epoch 0 whole, epoch 1's first 7 batches (28 samples), then nothing
    ds = CountedInfoBatch(range(50), 3, seed=0, budget=Budget(steps=0.5), batch_size=lambda: 4)
    loader = DataLoader(ds, batch_size=4, sampler=ds.sampler)
    steps = []
    for epoch in range(ds.epoch, ds.num_epochs):
        ds.set_epoch(epoch)
        steps.append(sum(1 for x in loader if ds.update(torch.ones(len(x))) is not None))
    assert steps == [13, 7] and ds.served == {0: 50, 1: 28} and ds.total_steps == 20 and ds.progress == 1.0


def _ranks_train_a_budget(rank: int, out: str) -> None:
    ds = CountedInfoBatch(range(50), 3, seed=0, budget=Budget(steps=0.5), batch_size=lambda: 4)
    loader = DataLoader(ds, batch_size=4, sampler=ds.sampler)
    seen: list[int] = []
    for epoch in range(ds.epoch, ds.num_epochs):
        ds.set_epoch(epoch)
        for x in loader:
            ds.update(torch.ones(len(x)))  # every step gathers every rank's rows: unequal ranks would hang
            seen += [int(i) for i in x]
    torch.save({"served": ds.served, "steps": ds.counts.steps, "seen": seen}, os.path.join(out, f"{rank}.pt"))
    dist.barrier()


def test_under_torch_distributed_every_rank_serves_and_trains_its_equal_share_of_a_budget() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(in_process_group, (2, os.path.join(tmp, "init"), _ranks_train_a_budget, tmp), 2)
        got = [torch.load(os.path.join(tmp, f"{r}.pt")) for r in range(2)]
    # each rank's share is 25: 7 steps an epoch, half of 21 is 11 (halves up): 7, then 4 (16 samples)
    assert [g["served"] for g in got] == [{0: 25, 1: 16}] * 2 and [g["steps"] for g in got] == [11, 11]
    epoch0 = got[0]["seen"][:25] + got[1]["seen"][:25]
    assert sorted(epoch0) == list(range(50))  # epoch 0: the two ranks' shares are the whole dataset
    epoch1 = got[0]["seen"][25:] + got[1]["seen"][25:]
    assert len(epoch1) == len(set(epoch1)) == 32
