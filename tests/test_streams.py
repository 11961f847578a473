"""InfoBatch on streams: fates by (seed, pass, key), unbiased weights, the update's checks.

The fates are checked against a plain-Python reading of the promise (the top 32 bits of
``mix_seed(seed, pass, key)`` below ``round(prune_ratio * 2**32)``, for keys whose frozen score
is below the mean), not against the code's own formula. Loaders, workers, Hugging Face streams
and resume: tests/test_streams_loaders.py.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch.utils.data import DataLoader

from leanbatch import ProgressLR, StreamInfoBatch, cosine
from leanbatch.permutation import mix_seed
from leanbatch.stream_pass import StreamPass


def reference_kept(
    keys: list[int], scores: dict[int, float], seed: int, p: int, ratio: float
) -> dict[int, float]:
    """key -> weight of the kept keys (plain Python, exact mean in float64 of float32 scores)."""
    finite = [s for s in scores.values() if s == s]
    mean = math.fsum(finite) / len(finite)
    cut = round(ratio * 2**32)
    weight = float(torch.tensor(2**32 / (2**32 - cut), dtype=torch.float32))
    out = {}
    for k in keys:
        candidate = k in scores and scores[k] == scores[k] and scores[k] < mean
        if not candidate:
            out[k] = 1.0
        elif (mix_seed(seed, p, k) >> 31) >= cut:
            out[k] = weight
    return out


def test_fates_are_the_promised_function_of_seed_pass_and_key() -> None:
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2**62, (3000,), generator=g)
    scores = torch.rand(3000, generator=g).to(torch.float32)
    scores[::10] = float("nan")  # never a finite loss: never a candidate
    plan = StreamPass.freeze(3, 11, keys, scores, 0.6)
    asked = torch.cat([keys[:2000], torch.randint(0, 2**62, (500,), generator=g)])  # and unseen keys
    kept, w = plan.fates(asked)
    want = reference_kept(asked.tolist(), dict(zip(keys.tolist(), scores.tolist(), strict=True)), 11, 3, 0.6)
    assert {k for k, ok in zip(asked.tolist(), kept.tolist(), strict=True) if ok} == set(want)
    assert {k: v for k, v, ok in zip(asked.tolist(), w.tolist(), kept.tolist(), strict=True) if ok} == want
    assert 0.19 < 1 - kept.float().mean() < 0.25  # 0.6 of the ~900 finite below-mean keys of 2,500
    assert torch.equal(plan.fates(asked.flip(0))[0], kept.flip(0))  # per key, not per position


def _estimates(plan_of, keys, g, trials: int, weight_error: float = 1.0) -> torch.Tensor:
    out = torch.empty(trials, dtype=torch.float64)
    for t in range(trials):
        kept, w = plan_of(t).fates(keys)
        w = w.double()
        w = torch.where(w > 1, w * weight_error, w)
        out[t] = (g[kept] * w[kept]).sum()
    return out


def test_the_weighted_sum_is_unbiased_and_a_5_percent_weight_error_is_caught() -> None:
    """E[sum_kept w_k g_k] = sum_k g_k over the hash's randomness (the seed), g correlated with the loss."""
    n = 100_000
    g0 = torch.Generator().manual_seed(1)
    keys = torch.randperm(10 * n, generator=g0)[:n]
    scores = torch.empty(n).exponential_(generator=g0)
    g = (1.0 + scores).double()
    total = float(g.sum())

    def plan_of(t: int) -> StreamPass:
        return StreamPass.freeze(1, t, keys, scores, 0.6)

    est = _estimates(plan_of, keys, g, trials=12)
    sem = float(est.std() / math.sqrt(len(est)))
    assert abs(float(est.mean()) - total) < 5 * sem
    for err in (0.95, 1.05):
        assert abs(float(_estimates(plan_of, keys, g, 12, err).mean()) - total) > 25 * sem


def test_inclusion_frequencies_over_passes_match_the_weights() -> None:
    """Measured over 400 passes (the pass index keys the hash): each key's inclusion frequency is 1/weight."""
    n, passes = 2000, 400
    keys = torch.arange(n) * 1_000_003
    scores = torch.rand(n, generator=torch.Generator().manual_seed(2)) ** 2
    counts = torch.zeros(n)
    for p in range(passes):
        kept, w = StreamPass.freeze(p, 5, keys, scores, 0.5).fates(keys)
        counts += kept
    plan = StreamPass.freeze(0, 5, keys, scores, 0.5)
    promised = torch.where(torch.isin(keys, plan.candidates), 1 / plan.weight, 1.0).double()
    assert plan.weight == 2.0 and (promised < 1).sum() == (scores < scores.mean()).sum()
    freq = counts.double() / passes
    sure = promised == 1.0
    assert torch.all(freq[sure] == 1.0)
    p = promised[~sure]
    z = (freq[~sure] - p) / torch.sqrt(p * (1 - p) / passes)
    assert float(z.abs().max()) < 5.5 and abs(float(z.mean())) < 0.1 and 0.8 < float(z.std()) < 1.2


def make(n: int = 64, **kw) -> StreamInfoBatch:
    stream = lambda: ({"id": 1000 + 7 * i, "x": torch.tensor([float(i)])} for i in range(n))  # noqa: E731
    return StreamInfoBatch(stream, key="id", **{"num_passes": 4, **kw})


def train_pass(sib: StreamInfoBatch, p: int, batch_size: int = 8) -> list[int]:
    sib.set_pass(p)
    seen = []
    for batch in DataLoader(sib.dataset, batch_size=batch_size):
        sib.update((batch["x"][:, 0] % 5) * 0.5 + 0.1, batch["id"])
        seen += batch["id"].tolist()
    return seen


def test_passes_prune_the_below_mean_keys_then_anneal() -> None:
    sib = make(64, num_passes=4, delta=0.75, seed=3)
    assert len(train_pass(sib, 0)) == 64  # nothing scored yet: everything
    scores = dict(zip(*[x.tolist() for x in sib.scores.items()], strict=True))
    kept = train_pass(sib, 1)
    assert sorted(kept) == sorted(reference_kept(list(scores), scores, 3, 1, 0.5))
    assert len(kept) < 64 and sib.stats()["candidates"] > 0
    third = train_pass(sib, 2)
    assert len(train_pass(sib, 3)) == 64  # floor(0.75 * 4) = 3: the last pass keeps everything
    assert sib.stats()["trained"] == 64 + len(kept) + len(third) + 64


def test_update_returns_the_weighted_mean_and_reads_weights_from_the_keys() -> None:
    sib = make(64, seed=0)
    train_pass(sib, 0)
    sib.set_pass(1)
    batch = next(iter(DataLoader(sib.dataset, batch_size=16)))
    loss = torch.rand(16, requires_grad=True)
    out = sib.update(loss, batch["id"])
    kept, w = sib.current.fates(batch["id"])
    assert kept.all() and (w > 1).any()
    torch.testing.assert_close(out, (loss * w).mean())
    out.backward()
    torch.testing.assert_close(loss.grad, w / 16)


def test_the_weighted_mean_does_not_overflow_where_the_weighted_mean_fits() -> None:
    """Losses near float32's maximum, weights 2: ``(loss * w).mean()`` overflows, ours does not; fp16
    losses whose weighted mean is past fp16's range come back in float32, finite."""
    sib = make(64, seed=0)
    train_pass(sib, 0)
    sib.set_pass(1)
    batch = next(iter(DataLoader(sib.dataset, batch_size=16)))
    w = sib.current.fates(batch["id"])[1]
    big = torch.full((16,), 3.0e38)
    assert torch.isinf((big * w).mean()) and (w > 1).any()
    mine = make(64, seed=0)
    mine.load_state_dict(sib.state_dict())
    got = mine.update(big * (0.6 / float(w.mean())), batch["id"])
    assert torch.isfinite(got) and got.dtype == torch.float32
    half = make(64, seed=0)
    half.load_state_dict(sib.state_dict())
    got = half.update(torch.full((16,), 60000.0, dtype=torch.float16), batch["id"])
    assert got.dtype == torch.float32 and float(got) == pytest.approx(60000.0 * float(w.mean()), rel=1e-3)


def test_the_update_reads_no_tensor_value_on_the_device() -> None:
    """A CPU stand-in for CUDA's no-sync rule (tests/test_sync_free.py): the scores on ``meta``, the
    losses on ``meta``; keys on the CPU, as the loader gives them."""
    sib = make(64, seed=0)
    train_pass(sib, 0)
    sib.set_pass(1)
    sib.scores.to("meta")
    for batch in DataLoader(sib.dataset, batch_size=8):
        loss = torch.empty(len(batch["id"]), device="meta", requires_grad=True)
        out = sib.update(loss, batch["id"])
        out.backward()
        assert out.device.type == "meta" and loss.grad is not None
    sib.scores.flush()


def test_a_budget_anneals_a_stream_without_passes() -> None:
    """num_samples: a pass that starts once delta * num_samples samples were trained keeps everything."""
    sib = make(64, num_passes=None, num_samples=256, delta=0.5, seed=1)
    sizes = [len(train_pass(sib, p)) for p in range(5)]
    assert sizes[0] == 64 and sizes[1] < 64  # 64 trained < 128: prunes
    assert sib.prunes(99) is False and sizes[-1] == 64  # past 128 trained: keeps all
    assert sib.progress == 1.0


def test_progress_drives_the_lr_schedule() -> None:
    sib = make(64, num_passes=4, seed=0)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = ProgressLR(opt, sib, cosine())
    train_pass(sib, 0)
    assert sib.progress == 0.0  # the first pass's length is unknown while it runs
    sib.set_pass(1)
    assert sib.progress == 0.25
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(cosine()(0.25))


def test_state_round_trips_and_a_resumed_pass_decides_the_same() -> None:
    sib = make(64, seed=4)
    train_pass(sib, 0)
    sib.set_pass(1)
    it = iter(DataLoader(sib.dataset, batch_size=8))
    first = next(it)
    sib.update(torch.rand(8), first["id"])
    buf = io.BytesIO()
    torch.save(sib.state_dict(), buf)
    buf.seek(0)
    back = make(64, seed=4)
    back.load_state_dict(torch.load(buf, weights_only=True))
    assert back.pass_index == 1 and back.stats() == sib.stats()
    again = [k for b in DataLoader(back.dataset, batch_size=8) for k in b["id"].tolist()]  # pass 1 read anew
    assert again == first["id"].tolist() + [k for b in it for k in b["id"].tolist()]  # decided the same
    with pytest.raises(ValueError, match="two items with key"):  # the first batch was trained before the save
        back.update(torch.rand(8), first["id"])
    with pytest.raises(ValueError, match="seed=4"):
        make(64, seed=5).load_state_dict(sib.state_dict())


# ---------------------------------------------------------------------------- bad input
def test_bad_arguments_are_refused_at_construction() -> None:
    gen = (i for i in range(3))
    with pytest.raises(TypeError, match="one-shot iterator"):
        StreamInfoBatch(gen, num_passes=2, key="id")
    with pytest.raises(ValueError, match="exactly one of num_passes"):
        StreamInfoBatch(lambda: iter(()), key="id")
    with pytest.raises(ValueError, match="prune_ratio"):
        StreamInfoBatch(lambda: iter(()), 2, key="id", prune_ratio=1.0)
    with pytest.raises(ValueError, match="delta"):
        StreamInfoBatch(lambda: iter(()), 2, key="id", delta=0.0)
    with pytest.raises(TypeError, match="key must be"):
        StreamInfoBatch(lambda: iter(()), 2, key=None)


def test_a_key_twice_in_a_pass_is_refused_and_nothing_stored() -> None:
    sib = make(64, seed=0)
    ids = torch.tensor([1000, 1007])
    sib.update(torch.ones(2), ids)
    before = sib.state_dict()
    with pytest.raises(ValueError, match="two items with key 1007 in pass 0"):
        sib.update(torch.ones(2), torch.tensor([1014, 1007]))
    with pytest.raises(ValueError, match="two items with key 1021 in pass 0"):
        sib.update(torch.ones(2), torch.tensor([1021, 1021]))
    assert sib.scores.get(torch.tensor([1014, 1021])).isnan().all()
    assert sib.stats()["trained"] == 2 and sib.state_dict()["in_pass"] == before["in_pass"]
    sib.set_pass(1)
    sib.update(torch.ones(2), ids)  # a new pass: seen once again


def test_forgetting_set_pass_is_caught_at_the_first_batch_of_the_second_pass() -> None:
    sib = make(16, seed=0)
    loader = DataLoader(sib.dataset, batch_size=4)
    for batch in loader:
        sib.update(torch.ones(4), batch["id"])
    with pytest.raises(ValueError, match="Call set_pass"):
        for batch in loader:
            sib.update(torch.ones(4), batch["id"])


def test_a_dropped_key_that_reaches_the_update_is_refused() -> None:
    """Training on the raw stream (or with a stale pass) would give dropped samples weight 1 silently."""
    sib = make(64, seed=0)
    train_pass(sib, 0)
    sib.set_pass(1)
    kept, _ = sib.current.fates(torch.tensor([1000 + 7 * i for i in range(64)]))
    dropped = [1000 + 7 * i for i in range(64) if not kept[i]]
    with pytest.raises(ValueError, match=f"key {dropped[0]} was dropped in pass 1"):
        sib.update(torch.ones(1), torch.tensor([dropped[0]]))


def test_bad_update_arguments_name_the_argument() -> None:
    sib = make(16)
    with pytest.raises(TypeError, match="keys must be a 1-D tensor of integer keys"):
        sib.update(torch.ones(2), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="loss has 2 entries but keys has 3"):
        sib.update(torch.ones(2), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="loss is a scalar"):
        sib.update(torch.tensor(1.0), torch.tensor([1]))
    assert sib.stats()["trained"] == 0 and sib.scores.count == 0


def test_the_expected_weighted_gradient_through_the_loader_is_the_full_streams() -> None:
    """A fixed linear model, 100 pruning passes over a stream of 256 (the pass keys the hash): the
    mean of each pass's gradient, summed over its batches as sum_b (B_b / N) grad(update(loss_b)),
    is the full stream's gradient; the same sum without the weights is far from it."""
    n, passes = 256, 100
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 5, generator=g), torch.randn(n, generator=g) * 3
    w = torch.randn(5, generator=g).requires_grad_()

    def losses(i: torch.Tensor) -> torch.Tensor:
        return (x[i] @ w - y[i]) ** 2

    full = torch.autograd.grad(losses(torch.arange(n)).mean(), w)[0]
    sib = StreamInfoBatch(lambda: ({"id": 5 * i} for i in range(n)), passes + 1, key="id", delta=1.0)
    loader = DataLoader(sib.dataset, batch_size=32)
    weighted, plain = torch.empty(passes, 5), torch.empty(passes, 5)
    for p in range(passes + 1):
        sib.set_pass(p)
        gw, gp = torch.zeros(5), torch.zeros(5)
        for batch in loader:
            i = batch["id"] // 5
            loss = losses(i)
            gw += torch.autograd.grad(sib.update(loss, batch["id"]) * len(i) / n, w, retain_graph=True)[0]
            gp += torch.autograd.grad(loss.sum() / n, w)[0]
        if p:
            weighted[p - 1], plain[p - 1] = gw, gp
    assert sib.stats()["candidates"] > 50
    sem = weighted.std(0) / math.sqrt(passes)
    assert torch.all((weighted.mean(0) - full).abs() < 5 * sem)
    assert torch.any((plain.mean(0) - full).abs() > 8 * sem)  # unweighted: biased (13 sem), and seen


def test_the_loaders_set_epoch_moves_the_pass_and_the_sources_epoch() -> None:
    """What the Hugging Face Trainer and accelerate call on the dataset; a source's own set_epoch
    (a Hugging Face stream's shuffle) follows the pass, after a resume too."""

    class Source:
        epochs: list[int] = []

        def __iter__(self):
            return ({"id": i} for i in range(4))

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

    sib = StreamInfoBatch(Source(), 3, key="id")
    sib.dataset.set_epoch(0)  # the pass it is at: nothing to do
    sib.dataset.set_epoch(1)
    assert sib.pass_index == 1 and Source.epochs == [1]
    back = StreamInfoBatch(Source(), 3, key="id")
    back.load_state_dict(sib.state_dict())
    assert back.pass_index == 1 and Source.epochs == [1, 1]


def test_an_empty_batch_returns_zero() -> None:
    sib = make(8)
    loss = torch.empty(0, requires_grad=True)
    out = sib.update(loss, torch.empty(0, dtype=torch.int64))
    assert float(out) == 0.0 and sib.stats()["trained"] == 0
