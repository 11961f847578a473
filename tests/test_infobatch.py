"""The InfoBatch wrapper: update() semantics, statistics, schedules and bad input."""

import copy
import io
import pickle
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from leanbatch import InfoBatch, ProgressLR, cosine

N = 200


def index_data(n: int = N) -> TensorDataset:
    """Item i is (i as float, i): a loss computed from it tells which sample it belongs to."""
    return TensorDataset(torch.arange(n, dtype=torch.float32), torch.arange(n))


def fake_loss(x: torch.Tensor) -> torch.Tensor:
    return (x / N + 0.01).requires_grad_()


def run_epoch(ds, loader):
    for x, _ in loader:
        ds.update(fake_loss(x))


def test_scores_align_with_samples_and_weighted_mean():
    ds = InfoBatch(index_data(), num_epochs=3, prune_ratio=0.5, delta=0.67, seed=1)
    loader = DataLoader(ds, batch_size=32, sampler=ds.sampler)
    ds.set_epoch(0)
    run_epoch(ds, loader)
    assert torch.allclose(ds.scores.values, torch.arange(N) / N + 0.01)
    ds.set_epoch(1)
    plan = ds.sampler.plan()
    assert plan.pruning and plan.num_kept < N
    for x, i in loader:
        loss = fake_loss(x)
        out = ds.update(loss)
        expected = (loss * plan.weights[i]).mean()
        assert torch.allclose(out, expected)
        out.backward()
        assert torch.allclose(loss.grad, plan.weights[i] / len(i))


def test_update_accepts_half_precision_and_does_not_modify_input():
    ds = InfoBatch(index_data(), 2, seed=0)
    loader = DataLoader(ds, batch_size=50, sampler=ds.sampler)
    for dtype in (torch.float16, torch.bfloat16):
        ds.set_epoch(0)
        for x, _ in loader:
            loss = (x / N).to(dtype)
            before = loss.clone()
            out = ds.update(loss)
            assert torch.equal(loss, before)
            assert torch.isfinite(out)
        assert ds.scores.values.dtype == torch.float32
        assert torch.allclose(ds.scores.values, torch.arange(N) / N, atol=1e-2)


def test_nonfinite_losses_are_counted_not_stored_and_still_returned():
    ds = InfoBatch(index_data(10), 2, seed=0)
    loader = DataLoader(ds, batch_size=5, sampler=ds.sampler)
    ds.set_epoch(0)
    batches = iter(loader)
    x, i = next(batches)
    ds.update(x / 10 + 1)
    x, i2 = next(batches)
    loss = torch.tensor([float("nan"), float("inf"), 1.0, 2.0, -float("inf")])
    out = ds.update(loss)
    assert torch.isnan(out)  # training code sees the NaN as usual
    assert ds.nonfinite_count == 3
    v = ds.scores.values
    assert torch.isnan(v[i2[[0, 1, 4]]]).all()  # never scored stays never scored
    assert v[i2[2]] == 1.0 and v[i2[3]] == 2.0
    # a finite score is kept when a later loss is NaN
    ds.scores.update(i, torch.full((5,), float("nan")))
    assert torch.allclose(ds.scores.values[i], i / 10 + 1)
    ds.set_epoch(1)
    len(ds.sampler)  # plans epoch 1
    assert ds.epoch_stats[-1]["nonfinite_so_far"] == 8


def test_explicit_indices_path_and_ema():
    ds = InfoBatch(index_data(10), 3, ema=0.5)
    idx = torch.tensor([3, 7])
    ds.update(torch.tensor([1.0, 2.0]), idx)
    ds.update(torch.tensor([3.0, 4.0]), idx)
    assert ds.scores.values[idx].tolist() == [2.0, 3.0]
    assert ds.weights(idx).tolist() == [1.0, 1.0]


def test_statistics_and_pruned_count():
    ds = InfoBatch(index_data(), num_epochs=4, prune_ratio=0.5, delta=0.5)
    loader = DataLoader(ds, batch_size=16, sampler=ds.sampler)
    seen = 0
    for epoch in range(4):
        ds.set_epoch(epoch)
        announced = len(loader)  # read before the epoch, as progress bars and schedulers do
        batches = 0
        for x, _ in loader:
            ds.update(fake_loss(x))
            seen += len(x)
            batches += 1
        assert batches == announced
    stats = ds.epoch_stats
    assert [s["pruning"] for s in stats] == [False, True, False, False]  # epoch 0: nothing scored yet
    assert stats[1]["threshold"] == pytest.approx(float((torch.arange(N) / N + 0.01).mean()), rel=1e-5)
    assert ds.get_pruned_count() == stats[1]["pruned"] > 0
    assert seen == 4 * N - ds.get_pruned_count()


def test_progress_lr_ends_exactly_at_the_end_of_training():
    ds = InfoBatch(index_data(), num_epochs=5, prune_ratio=0.7, delta=0.8)
    loader = DataLoader(ds, batch_size=16, sampler=ds.sampler)
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    sched = ProgressLR(opt, ds, cosine(warmup=0.1))
    lrs = []
    for epoch in range(5):
        ds.set_epoch(epoch)
        for x, _ in loader:
            ds.update(fake_loss(x) * w.sum().add(1)).backward()
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
    assert ds.progress == 1.0
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert max(lrs) == pytest.approx(0.1, rel=0.05)
    assert min(lrs[:-1]) > 0


def test_progress_lr_state_saves_as_plain_values_and_resumes():
    ds = InfoBatch(index_data(), num_epochs=2)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = ProgressLR(opt, ds, cosine(warmup=0.1))
    for _ in range(3):
        opt.step()
        sched.step()
    buf = io.BytesIO()
    torch.save({"sched": sched.state_dict(), "opt": opt.state_dict()}, buf)  # was: can't pickle a lambda
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    opt2 = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched2 = ProgressLR(opt2, ds, cosine(warmup=0.1))
    opt2.load_state_dict(state["opt"])
    sched2.load_state_dict(state["sched"])
    assert sched2.last_epoch == sched.last_epoch == 3
    assert sched2.get_last_lr() == sched.get_last_lr()
    sched2.step()  # still driven by the progress object it was built with
    assert sched2.get_last_lr() == [0.0]  # progress 0: the warm-up starts at 0


def test_wrapper_pickles_and_deepcopies_and_delegates_attributes():
    data = index_data()
    data.classes = ["a", "b"]
    ds = InfoBatch(data, 2)
    ds.update(torch.ones(3), torch.tensor([0, 1, 2]))
    for clone in (pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)):
        assert clone.classes == ["a", "b"]
        assert len(clone) == N and clone[5][1] == 5
        assert torch.equal(clone.scores.values.nan_to_num(-1), ds.scores.values.nan_to_num(-1))
    with pytest.raises(
        AttributeError,
        match=r"'InfoBatch' object has no attribute 'updte', nor has the dataset it wraps \(TensorDataset\)",
    ):
        _ = ds.updte


def test_a_type_checker_sees_a_misspelt_method_of_the_wrapper(tmp_path):
    """The forwarding to the wrapped dataset is hidden from type checkers: ``ds.updte(...)`` is a
    mypy error, not an ``Any``."""
    user = tmp_path / "user.py"
    user.write_text(
        "import torch\nfrom leanbatch import InfoBatch\n\nds = InfoBatch([1, 2], 2)\nds.updte(torch.ones(2))\n"
    )
    ini = tmp_path / "mypy.ini"
    ini.write_text(
        "[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n[mypy-torch.utils.data.*]\nfollow_imports = normal\n"
    )
    command = [sys.executable, "-m", "mypy", "--config-file", str(ini), "--no-incremental", str(user)]
    r = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert '"InfoBatch" has no attribute "updte"' in r.stdout, r.stdout + r.stderr


def test_half_precision_losses_are_reduced_in_float32() -> None:
    """fp16 losses of 50,000 with weights 1 and 2: the weighted mean (about 75,000) is past fp16's
    range, so it comes back in float32, finite, as ``loss.mean()`` (about 50,000) is."""
    ds = InfoBatch(index_data(8), num_epochs=2, prune_ratio=0.5, delta=1.0, seed=0)
    idx = torch.tensor(list(ds.sampler))
    ds.update(idx.float(), idx)  # epoch 0 trained: scores 0 .. 7, mean 3.5
    pair = torch.tensor([int(i) for i in ds.sampler if int(i) < 4][:1] + [7])
    assert ds.weights(pair).tolist() == [2.0, 1.0]
    half = torch.full((2,), 50_000.0, dtype=torch.float16)  # 49,984 in fp16
    assert float(half.mean()) == float(half[0])
    out = ds.update(half, pair)
    assert out.dtype == torch.float32 and float(out) == 1.5 * float(half[0])


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(3)


class Empty(torch.utils.data.Dataset):
    def __len__(self):
        return 0

    def __getitem__(self, i):
        raise IndexError(i)


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: InfoBatch(index_data(), 4, prune_ratio=1.0), ValueError, "prune_ratio"),
        (lambda: InfoBatch(index_data(), 4, prune_ratio=-0.5), ValueError, "prune_ratio"),
        (lambda: InfoBatch(index_data(), 4, delta=0), ValueError, "delta"),
        (lambda: InfoBatch(index_data(), 4, delta=1.01), ValueError, "delta"),
        (lambda: InfoBatch(index_data(), 0), ValueError, "num_epochs"),
        (lambda: InfoBatch(Empty(), 4), ValueError, "empty"),
        (lambda: InfoBatch(Stream(), 4), TypeError, "map-style"),
        (lambda: InfoBatch(index_data(), 4, policy="smart"), ValueError, "policy"),
        (lambda: InfoBatch(index_data(), 4, ema=1.0), ValueError, "ema"),
    ],
)
def test_bad_construction(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_bad_losses_and_indices():
    ds = InfoBatch(index_data(), 2)
    loader = DataLoader(ds, batch_size=10, sampler=ds.sampler)
    x, i = next(iter(loader))
    with pytest.raises(ValueError, match="scalar"):
        ds.update(fake_loss(x).mean())
    with pytest.raises(ValueError, match=r"shape \(batch,\)"):
        ds.update(fake_loss(x).reshape(2, 5))
    with pytest.raises(TypeError, match="floating"):
        ds.update(i)
    with pytest.raises(ValueError, match="indices has"):
        ds.update(fake_loss(x), i[:5])
    with pytest.raises(IndexError, match="out of range"):
        ds.update(torch.ones(2), torch.tensor([0, N]))
    with pytest.raises(IndexError, match="out of range"):
        ds.update(torch.ones(2), torch.tensor([-1, 3]))
    with pytest.raises(TypeError, match="integer"):
        ds.update(torch.ones(2), torch.tensor([0.0, 1.0]))


def test_implicit_update_detects_misaligned_losses():
    ds = InfoBatch(index_data(), 2)
    with pytest.raises(RuntimeError, match="sampler=ds.sampler"):
        ds.update(torch.ones(4))  # nothing served yet
    loader = DataLoader(ds, batch_size=10, sampler=ds.sampler)
    it = iter(loader)
    x, _ = next(it)
    ds.update(fake_loss(x))
    x, _ = next(it)
    with pytest.raises(ValueError, match="the batch it trains has 10"):
        ds.update(fake_loss(x)[:7])  # someone filtered the batch
    ds2 = InfoBatch(index_data(), 2)
    loader2 = DataLoader(ds2, batch_size=10, sampler=ds2.sampler)
    with pytest.raises(ValueError, match="served only"):
        for x, _ in loader2:
            ds2.update(torch.cat([fake_loss(x)] * 2000))


def test_state_dict_from_another_dataset_size_is_rejected():
    a, b = InfoBatch(index_data(), 2), InfoBatch(index_data(N + 1), 2)
    with pytest.raises(ValueError, match="same dataset"):
        b.load_state_dict(a.state_dict())


def test_out_of_range_indices_in_a_pruning_epoch_are_rejected_before_anything_is_recorded():
    ds = InfoBatch(index_data(), 4, seed=0)
    ds.scores.update(torch.arange(N), torch.rand(N, generator=torch.Generator().manual_seed(0)))
    ds.set_epoch(1)  # a pruning epoch: the weights exist, so the range check rides on their gather
    assert ds.sampler.plan().pruning
    before = ds.sampler.position
    for bad in (torch.tensor([0, N]), torch.tensor([-1, 3]), torch.tensor([5, N + 7], dtype=torch.int32)):
        with pytest.raises(IndexError, match=f"every index must be in \\[0, {N}\\)"):
            ds.update(torch.ones(2), bad)
    assert ds.sampler.position == before
    scores_before = ds.scores.values.clone()
    ds.update(torch.full((2,), 7.0), torch.tensor([3, 4], dtype=torch.int32))
    assert ds.scores.values[[3, 4]].tolist() == [7.0, 7.0]
    assert torch.equal(ds.scores.values[5:], scores_before[5:])


def test_a_loss_modified_in_place_after_update_is_an_error_not_a_wrong_score():
    from leanbatch import ScoreTable

    ds = InfoBatch(index_data(), 2)
    loss = torch.tensor([0.5, 0.25])
    ds.update(loss, torch.tensor([0, 1]))
    loss.mul_(100.0)  # after update(): the queued score must not silently become 50
    with pytest.raises(RuntimeError, match="modified in place"):
        ds.scores.values  # noqa: B018
    idx = torch.tensor([2, 3])
    ds.update(torch.ones(2), idx)
    idx.add_(10)  # indices are copied: changing the caller's tensor afterwards changes nothing
    assert ds.scores.values[[2, 3]].tolist() == [1.0, 1.0] and ds.scores.values[[12, 13]].isnan().all()
    # Modifying a copy is fine, and so is modifying the caller's tensor once scores are stored.
    loss = torch.tensor([0.5, 0.25])
    ds.update(loss.clone(), torch.tensor([6, 7]))
    ds.scores.flush()
    loss.mul_(3.0)
    assert ds.scores.values[[6, 7]].tolist() == [0.5, 0.25]
    # The low-level store() queues the caller's indices by reference: changing them is caught too.
    table = ScoreTable(10)
    idx = torch.tensor([1, 2])
    table.store(idx, torch.ones(2))
    idx.add_(1)
    with pytest.raises(RuntimeError, match="modified in place"):
        table.flush()


def test_explicit_indices_aliasing_a_reused_numpy_array_are_stored_as_they_were():
    np = pytest.importorskip("numpy")
    ds = InfoBatch(index_data(), 2)
    buf = np.array([0, 1], dtype=np.int64)
    ds.update(torch.tensor([0.5, 0.25]), torch.from_numpy(buf))
    buf[:] = [8, 9]  # the loop reuses its index array: torch sees no in-place op
    ds.update(torch.tensor([0.75, 0.125]), torch.from_numpy(buf))
    v = ds.scores.values
    assert v[[0, 1, 8, 9]].tolist() == [0.5, 0.25, 0.75, 0.125]


def test_progress_lr_state_saves_and_resumes(tmp_path):
    """The scheduler's state goes through torch.save / torch.load(weights_only=True), as checkpoints do."""
    done = [0.25]
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = ProgressLR(opt, lambda: done[0], cosine())
    opt.step()
    sched.step()
    torch.save(sched.state_dict(), tmp_path / "sched.pt")
    opt2 = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    resumed = ProgressLR(opt2, lambda: done[0], cosine())
    resumed.load_state_dict(torch.load(tmp_path / "sched.pt", weights_only=True))
    assert resumed.last_epoch == sched.last_epoch == 1
    done[0] = 0.5
    opt2.step()
    resumed.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.05)  # still driven by its own progress source
