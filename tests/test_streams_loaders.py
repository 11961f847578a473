"""Streams through real loaders: worker processes, Hugging Face streaming datasets, a plain
generator, torchdata's StatefulDataLoader resuming mid-pass, and a training loop that trains."""

from __future__ import annotations

import gc
import io
import math
import re

import pytest
import torch
import torch.nn.functional as F
from datasets import IterableDataset as HFIterableDataset
from torch.utils.data import DataLoader, get_worker_info
from torch.utils.data import IterableDataset as TorchIterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from leanbatch import SelectiveBackprop, StreamInfoBatch
from leanbatch.permutation import mix_seed

N = 240
SHARDS = [list(range(s, N, 4)) for s in range(4)]  # 4 shards of the stream: 2 workers read 2 each


@pytest.fixture
def quick_worker_shutdown(monkeypatch):
    """A DataLoader whose worker raised joins its workers with a 5 s timeout when collected (torch's
    MP_STATUS_CHECK_INTERVAL, in any IterableDataset): shortened here, and collected at once."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    yield
    gc.collect()


def first_error(loader) -> Exception:
    """The exception iterating ``loader`` raises, its traceback (and the iterator it holds) dropped."""
    try:
        for _ in loader:
            pass
    except Exception as e:
        e.__traceback__ = None
        return e
    raise AssertionError("iterating the loader raised nothing")


def loss_of(key: int) -> float:
    return float((key * 37) % 11) / 4.0  # a loss that depends on the sample only


def items(shards):
    for shard in shards:
        for i in shard:
            yield {"id": 10_000 + 3 * i, "x": [float(i)]}


def hf_stream() -> HFIterableDataset:
    return HFIterableDataset.from_generator(items, gen_kwargs={"shards": SHARDS})


def plain_stream():
    return items(SHARDS)


class ShardedStream(TorchIterableDataset):
    """A user's sharded IterableDataset: each worker reads its own shards (get_worker_info)."""

    def __iter__(self):
        info = get_worker_info()
        mine = SHARDS if info is None else SHARDS[info.id :: info.num_workers]
        return items(mine)


def promised(sib: StreamInfoBatch, p: int) -> set[int]:
    """The keys pass ``p`` keeps, from (seed, pass, key) and the frozen scores, in plain Python."""
    keys, values = (x.tolist() for x in sib.scores.items())
    mean = math.fsum(values) / len(values)
    cut = round(0.5 * 2**32)
    everything = [10_000 + 3 * i for i in range(N)]
    return {
        k
        for k in everything
        if not (k in keys and values[keys.index(k)] < mean) or (mix_seed(0, p, k) >> 31) >= cut
    }


def run_pass(sib, loader, p: int) -> list[int]:
    sib.set_pass(p)
    seen = []
    for batch in loader:
        keys = batch["id"]
        sib.update(torch.tensor([loss_of(int(k)) for k in keys]), keys)
        seen += keys.tolist()
    return seen


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("source", ["hf", "plain", "sharded"])
def test_two_workers_decide_every_sample_as_its_seed_pass_and_key_say(source) -> None:
    """Each sample's fate is the one (seed, pass, key) gives, whoever decides it: 2 workers, one
    process, and 3 workers decide the same set; every kept sample arrives exactly once."""
    stream = {"hf": hf_stream, "plain": plain_stream, "sharded": ShardedStream}[source]
    made = stream() if source != "plain" else stream
    sib = StreamInfoBatch(made, num_passes=3, key="id", seed=0)
    loader = DataLoader(sib.dataset, batch_size=16, num_workers=2)
    first = run_pass(sib, loader, 0)
    assert sorted(first) == [10_000 + 3 * i for i in range(N)]
    want = promised(sib, 1)
    state = sib.state_dict()
    kept = run_pass(sib, loader, 1)
    assert len(kept) == len(set(kept)) and set(kept) == want and len(want) < N
    for workers in (0, 3):
        other = StreamInfoBatch(made, num_passes=3, key="id", seed=0)
        other.load_state_dict(state)  # the same scores, frozen at pass 1's start
        again = DataLoader(other.dataset, batch_size=16, num_workers=workers)
        assert set(run_pass(other, again, 1)) == want


def test_persistent_workers_are_refused_at_the_second_pass(quick_worker_shutdown) -> None:
    sib = StreamInfoBatch(plain_stream, num_passes=3, key="id")
    loader = DataLoader(sib.dataset, batch_size=16, num_workers=2, persistent_workers=True)
    run_pass(sib, loader, 0)
    sib.set_pass(1)
    error = first_error(loader)
    del loader
    assert isinstance(error, RuntimeError) and "persistent_workers=False" in str(error)


@pytest.mark.parametrize("source", ["hf", "plain"])
def test_a_stateful_loader_resumed_mid_pass_decides_as_the_uninterrupted_run(source) -> None:
    """StatefulDataLoader, 2 workers: save the method's and the loader's states mid-pass (through
    torch.load(weights_only=True)), build everything anew, load, continue: the same batches."""
    made = hf_stream() if source == "hf" else plain_stream

    def build():
        sib = StreamInfoBatch(made, num_passes=3, key="id", seed=0)
        return sib, StatefulDataLoader(sib.dataset, batch_size=8, num_workers=2)

    sib, loader = build()
    run_pass(sib, loader, 0)
    scored = sib.state_dict()
    whole = run_pass(sib, loader, 1)
    end = sib.state_dict()

    sib, loader = build()
    sib.load_state_dict(scored)
    sib.set_pass(1)
    before, saved = [], None
    for step, batch in enumerate(loader):
        keys = batch["id"]
        sib.update(torch.tensor([loss_of(int(k)) for k in keys]), keys)
        before += keys.tolist()
        if step == 4:
            buf = io.BytesIO()
            torch.save({"sib": sib.state_dict(), "loader": loader.state_dict()}, buf)
            break
    del loader
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    sib, loader = build()
    sib.load_state_dict(saved["sib"])
    loader.load_state_dict(saved["loader"])
    after = run_pass(sib, loader, 1)  # set_pass(1) again: the same pass, nothing changes
    assert before + after == whole
    assert sib.state_dict()["scores"]["keys"].tolist() == end["scores"]["keys"].tolist()
    torch.testing.assert_close(sib.state_dict()["scores"]["values"], end["scores"]["values"])


def test_a_loader_state_of_another_pass_is_refused() -> None:
    sib = StreamInfoBatch(plain_stream, num_passes=3, key="id")
    loader = StatefulDataLoader(sib.dataset, batch_size=8)
    run_pass(sib, loader, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    sib.set_pass(1)
    fresh = StatefulDataLoader(sib.dataset, batch_size=8)
    fresh.load_state_dict(state)
    with pytest.raises(ValueError, match="the loader's state is of pass 0 but the stream is at pass 1"):
        next(iter(fresh))


def test_bad_items_are_refused_at_the_first_batch(quick_worker_shutdown) -> None:
    def no_key():
        yield {"id": 1}
        yield {"x": 2}

    def float_key():
        yield {"id": 1.5}

    def raising(item):
        raise KeyError("label")

    cases = [
        (StreamInfoBatch(no_key, 2, key="id"), ValueError, "of the stream has no 'id'"),
        (StreamInfoBatch(float_key, 2, key="id"), TypeError, "keys must be integers"),
        (StreamInfoBatch(lambda: iter([{"id": "a"}]), 2, key="id"), TypeError, "keys must be integers"),
        (
            StreamInfoBatch(lambda: iter([{"id": -4}]), 2, key="id"),
            ValueError,
            r"keys must be integers in \[0",
        ),
        (StreamInfoBatch(lambda: iter([{"id": True}]), 2, key="id"), TypeError, "not booleans"),
        (
            StreamInfoBatch(lambda: iter([1, 2]), 2, key=raising),
            ValueError,
            "the key function raised KeyError",
        ),
    ]
    for sib, error, match in cases:
        for workers in (0, 2):
            got = first_error(DataLoader(sib.dataset, batch_size=2, num_workers=workers))
            assert isinstance(got, error) and re.search(match, str(got)), got
        assert sib.scores.count == 0


def test_a_key_function_pairs_items_with_their_keys() -> None:
    sib = StreamInfoBatch(lambda: iter(range(5)), 2, key=lambda i: 100 + i, transform=lambda i: float(i) * 2)
    batch = next(iter(DataLoader(sib.dataset, batch_size=5)))
    x, keys = batch
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0] and keys.tolist() == [100, 101, 102, 103, 104]


def test_training_on_a_stream_trains_and_prunes() -> None:
    """sklearn's digits as a sharded stream, 2 workers, 6 passes: the model learns, the pruning
    passes train fewer samples, the last one all of them; Selective Backprop on the same batches."""
    from sklearn.datasets import load_digits

    x_all, y_all = load_digits(return_X_y=True)
    x_all = torch.tensor(x_all, dtype=torch.float32) / 16.0
    y_all = torch.tensor(y_all)
    n = len(y_all)

    class Digits(TorchIterableDataset):
        def __iter__(self):
            info = get_worker_info()
            rows = range(n) if info is None else range(info.id, n, info.num_workers)
            for i in rows:
                yield {"id": i, "x": x_all[i], "y": y_all[i]}

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sib = StreamInfoBatch(Digits(), num_passes=6, key="id", seed=0, delta=0.84)
    sb = SelectiveBackprop(start=0.5, end=0.9, keep=0.75, scale_factor=1.0, seed=0)
    loader = DataLoader(sib.dataset, batch_size=64, num_workers=2)
    with torch.no_grad():
        assert float((model(x_all).argmax(1) == y_all).float().mean()) < 0.2
    sizes, selected = [], 0
    for p in range(6):
        sib.set_pass(p)
        for i, batch in enumerate(loader):
            x, y, keys = batch["x"], batch["y"], batch["id"]
            (x, y), rows, _ = sb.select((x, y), model, F.cross_entropy, sib.progress, i)  # any batch
            if rows is not None:
                keys, selected = keys[rows], selected + 1
            loss = sib.update(F.cross_entropy(model(x), y, reduction="none"), keys)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sizes.append(sib.stats()["trained_in_pass"])
    with torch.no_grad():
        acc = float((model(x_all).argmax(1) == y_all).float().mean())
    assert acc > 0.93 and selected > 0
    assert sizes[0] == n and max(sizes[1:5]) < 0.8 * n  # passes 1-4 prune, pass 5 anneals:
    assert sizes[5] > sizes[4]  # every sample loaded (Selective Backprop trains a share of some batches)
