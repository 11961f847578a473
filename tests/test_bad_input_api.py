"""Bad input through the library's public API: a clear exception naming the argument, never a
silently wrong result. (The command line's bad input is in ``test_bad_input.py``.)"""

from __future__ import annotations

import math
import multiprocessing
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, InfoBatchPolicy, ProgressLR, RandomPolicy, ScoreTable, cosine
from leanbatch.policies.parts import Slice, global_mean

N = 40


def data(n: int = N) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32))


def fake_loss(x: torch.Tensor) -> torch.Tensor:
    return (x / N + 0.1).requires_grad_()


# ---------------------------------------------------------------------------- misaligned losses
@pytest.mark.parametrize("workers", [0, 2])
def test_a_consistently_short_loss_is_an_error_before_any_score_lands(workers):
    """3 losses for every batch of 4 once stored the next batch's losses under this batch's
    remaining indices, for a whole epoch; the DataLoader's fetched batch sizes catch it at once."""
    ds = InfoBatch(data(), 2, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=ds.sampler, num_workers=workers)
    x = next(iter(loader))[0]
    with pytest.raises(ValueError, match="loss has 3 entries but the batch it trains has 4"):
        ds.update(fake_loss(x)[:3])
    assert ds.scores.num_scored() == 0 and ds.position.trained == 0  # nothing landed, nothing counted


def _fetch_as(fetches, pid: int, batches: list[list[int]]) -> None:
    """In a forked process posing as DataLoader worker ``pid``: fetch ``batches`` through the dataset."""
    import leanbatch.ledger as module

    module.os.getpid = lambda: pid  # type: ignore[assignment]  # this child process only
    for batch in batches:
        fetches.fetched(batch)


def test_worker_processes_keys_all_arrive_whatever_their_pids_and_however_far_they_read_ahead():
    """Two worker processes whose pids are equal modulo 256, fetching at once, each 20 batches ahead of
    any update (more than a ring of 16 held): every batch matches, and a batch nobody fetched does not.
    (The rings gave both workers one slot, written by an unlocked read-modify-write, 16 keys deep.)"""
    ds = InfoBatch(data(), 2, seed=0)
    mine = ds.sampler.fetches
    fork = multiprocessing.get_context("fork")
    batches = {
        pid: [[pid + 3 * k, pid + 3 * k + 1, pid + 3 * k + 2] for k in range(20)] for pid in (1001, 1257)
    }
    workers = [fork.Process(target=_fetch_as, args=(mine, pid, b)) for pid, b in batches.items()]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    keys = [(3, b[0], b[-1]) for bs in batches.values() for b in bs]
    assert [mine.match(k) for k in keys] == [True] * 40
    assert mine.match((3, 0, 2)) is False


def test_keys_dropped_by_a_full_pipe_weaken_the_check_to_the_sizes_until_a_fresh_iteration():
    """A worker that fetches far more batches than the pipe holds before any update (an evaluation
    through workers): the keys it could not write are dropped, never blocking it; a batch whose key
    was dropped is not called a wrong batch (the sizes alone), and once the sampler begins a fresh
    iteration the check is exact again."""
    ds = InfoBatch(data(), 2, seed=0)
    mine = ds.sampler.fetches
    batches = [[k, k + 1, k + 2] for k in range(0, 3 * 5000, 3)]
    worker = multiprocessing.get_context("fork").Process(target=_fetch_as, args=(mine, 1001, batches))
    worker.start()
    worker.join(timeout=60)
    assert worker.exitcode == 0  # it never blocked on the full pipe
    assert mine.match((3, 3 * 2000, 3 * 2000 + 2)) is True  # the keys that fit arrived
    assert mine.match((3, 3 * 4999, 3 * 4999 + 2)) is None  # the last were dropped: the sizes decide
    list(ds.sampler)  # a fresh iteration, nothing in flight before it
    assert mine.match((3, 3 * 4999, 3 * 4999 + 2)) is False


def test_a_subset_of_the_batch_without_positions_is_an_error_and_with_them_lands_right():
    ds = InfoBatch(data(), 2, seed=0)
    it = iter(DataLoader(ds, batch_size=4, sampler=ds.sampler))
    (x,) = next(it)
    with pytest.raises(ValueError, match="positions=rows"):
        ds.update(fake_loss(x)[[0, 2]])  # the rows Selective Backprop kept, passed without their rows
    idx = ds.next_indices(4)
    ds.update(fake_loss(x)[[0, 2]], idx, positions=torch.tensor([0, 2]))
    assert ds.scores.get(idx[[0, 2]]).tolist() == pytest.approx((x[[0, 2]] / N + 0.1).tolist())
    assert ds.scores.get(idx[[1, 3]]).isnan().all()


def test_a_short_last_batch_is_still_accepted():
    ds = InfoBatch(data(10), 1, seed=0)
    for (x,) in DataLoader(ds, batch_size=4, sampler=ds.sampler):  # 4 + 4 + 2
        ds.update(fake_loss(x))
    assert ds.progress == 1.0 and ds.scores.num_scored() == 10


# ---------------------------------------------------------------------------- past the end
def test_training_past_num_epochs_serves_nothing_says_so_and_an_update_is_an_error():
    ds = InfoBatch(data(8), 2, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=ds.sampler)
    for _ in range(2):
        for (x,) in loader:
            ds.update(fake_loss(x))
    assert ds.progress == 1.0 and len(loader) == 2  # the last epoch's length: nothing planned past it
    with pytest.warns(RuntimeWarning, match="all 2 epochs .* are trained"):
        assert list(loader) == []  # a third epoch: nothing served
    with pytest.raises(RuntimeError, match="all 2 epochs are trained"):
        ds.update(torch.ones(4), torch.arange(4))
    assert [s["epoch"] for s in ds.epoch_stats] == [0, 1]  # no epoch 2 planned


def test_a_policy_that_disagrees_on_num_epochs_is_refused():
    with pytest.raises(ValueError, match=r"num_epochs=10.*num_epochs=8"):
        InfoBatch(data(), 10, policy=InfoBatchPolicy(num_epochs=8))
    assert InfoBatch(data(), 8, policy=RandomPolicy(num_epochs=8)).num_epochs == 8


# ---------------------------------------------------------------------------- schedules
def test_progress_lr_and_cosine_refuse_what_would_give_a_nan_or_negative_lr():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match="final"):
        cosine(final=-1.0)
    with pytest.raises(ValueError, match="warmup"):
        cosine(warmup=float("nan"))
    with pytest.raises(TypeError, match="lr_lambda"):
        ProgressLR(opt, lambda: 0.5, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="progress"):
        ProgressLR(opt, lambda: float("nan"), cosine())
    with pytest.raises(ValueError, match="progress"):
        cosine()(float("nan"))
    assert opt.param_groups[0]["lr"] == 1.0 or not math.isnan(opt.param_groups[0]["lr"])


# ---------------------------------------------------------------------------- huge losses
def test_huge_finite_losses_do_not_overflow_the_mean_into_pruning_everything():
    big = torch.full((1000,), 3e38)
    big[:10] = 1.0
    threshold, _ = global_mean(big, Slice(1000))
    assert math.isfinite(threshold) and threshold == pytest.approx(3e38 * 0.99, rel=1e-6)
    plan = InfoBatchPolicy(0.5, num_epochs=4)(big, 0, torch.Generator().manual_seed(0))
    assert plan.num_kept > 900  # only the 10 small losses are below the mean: at most 10 pruned


# ---------------------------------------------------------------------------- loaded states
def trained_state() -> dict:
    ds = InfoBatch(data(), 4, prune_ratio=0.5, delta=1.0, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=ds.sampler)
    for epoch in range(2):
        for k, (x,) in enumerate(loader):
            ds.update(fake_loss(x))
            if epoch == 1 and k == 2:  # mid-epoch, in a pruning epoch: the plan is saved
                return ds.state_dict()
    raise AssertionError("unreachable")


def corrupt(state: dict, path: tuple, value: object) -> dict:
    import copy

    out = copy.deepcopy(state)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    "path,value,needle",
    [
        (("sampler", "plan", "weights"), "nan", "weights"),
        (("sampler", "plan", "weights"), "negative", "weights"),
        (("sampler", "plan", "kept"), "negative", "kept"),
        (("sampler", "plan", "kept"), "past", "kept"),
        (("sampler", "position"), 10_000, "position 10000 is past the end"),
        (("sampler", "position"), -3, "position"),
        (("sampler", "epoch"), -1, "epoch"),
        (("sampler", "epoch"), KeyError, "has no key 'epoch'"),
        (("scores", "values"), KeyError, "has no key 'values'"),
        (("scores", "values"), "inf", "values"),
        (("scores", "num_samples"), N + 1, "same dataset"),
        (("sampler",), KeyError, "has no key 'sampler'"),
    ],
)
def test_a_loaded_state_is_checked_and_names_the_wrong_key(path, value, needle):
    state = trained_state()
    if value in ("nan", "negative", "past", "inf"):
        t = state
        for key in path:
            t = t[key]
        t = t.clone()
        if value == "nan":
            t[0] = float("nan")
        elif value == "negative":
            t[0] = -1
        elif value == "past":
            t[-1] = N + 5
        else:
            t[0] = float("inf")
        value = t
    ds = InfoBatch(data(), 4, prune_ratio=0.5, delta=1.0, seed=0)
    before = ds.state_dict()
    with pytest.raises(ValueError, match=needle):
        ds.load_state_dict(corrupt(state, path, value))
    after = ds.state_dict()  # nothing changed
    assert after["sampler"] == before["sampler"]
    torch.testing.assert_close(after["scores"]["values"], before["scores"]["values"], equal_nan=True)


def test_a_valid_state_still_resumes_and_a_state_of_another_version_is_refused():
    state = trained_state()
    ds = InfoBatch(data(), 4, prune_ratio=0.5, delta=1.0, seed=0)
    ds.load_state_dict(state)
    assert ds.position.epoch == 1 and ds.position.trained == 12
    for path, value in ((("version",), 1), (("sampler", "version"), KeyError), (("sampler", "version"), 3)):
        again = InfoBatch(data(), 4, prune_ratio=0.5, delta=1.0, seed=0)
        with pytest.raises(ValueError, match="version"):  # one release: no older format to convert
            again.load_state_dict(corrupt(state, path, value))
        assert again.position == (0, 0, 0)


def test_score_table_state_checks():
    table = ScoreTable(4)
    with pytest.raises(ValueError, match="has no key 'values'"):
        table.load_state_dict({"num_samples": 4})
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        table.load_state_dict({"num_samples": 4, "values": torch.zeros(3)})
    with pytest.raises(ValueError, match="nonfinite"):
        table.load_state_dict({"num_samples": 4, "values": torch.zeros(4), "nonfinite": -1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table.load_state_dict({"num_samples": 4, "values": torch.tensor([1.0, float("nan"), 2.0, 3.0])})
    assert table.num_scored() == 3
