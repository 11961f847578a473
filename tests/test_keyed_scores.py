"""The keyed score table: scores by stream key, bounded memory, the oldest keys forgotten first."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leanbatch import KeyedScoreTable, OnlineBatchSelection
from leanbatch.keyed_scores import check_keys
from leanbatch.permutation import mix_keys, mix_seed


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20),
    parts=st.lists(st.integers(0, 2**64 - 1), max_size=3),
)
def test_mix_keys_is_mix_seed_bit_for_bit(keys, parts) -> None:
    got = mix_keys(torch.tensor(keys, dtype=torch.int64), *parts).tolist()
    assert got == [mix_seed(*parts, k) for k in keys]


class Reference:
    """The table's promise, in plain Python: last finite loss per key; when full, the oldest
    stamps (then smallest keys) are forgotten down to 7/8 of the capacity, never the batch's own."""

    def __init__(self, capacity: int):
        self.capacity, self.scores, self.stamps, self.evicted = capacity, {}, {}, 0

    def update(self, keys: list[int], losses: list[float], clock: int) -> None:
        new = {k for k in keys if k not in self.scores}
        if len(self.scores) + len(new) > self.capacity:
            target = min(self.capacity * 7 // 8, self.capacity - len(new))
            mine = set(keys)
            order = sorted(self.scores, key=lambda k: (k in mine, self.stamps[k], k))
            for k in order[: len(self.scores) - target]:
                del self.scores[k], self.stamps[k]
                self.evicted += 1
        for k, v in zip(keys, losses, strict=True):
            if k not in self.scores:
                self.scores[k] = float("nan")
            if v == v and abs(v) != float("inf"):
                self.scores[k] = v
            self.stamps[k] = clock


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(8, 64),
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 120), st.sampled_from([0.5, 1.0, 2.5, float("nan")])), max_size=4),
        min_size=1,
        max_size=40,
    ),
)
def test_the_table_keeps_what_the_reference_keeps(capacity, batches) -> None:
    table, ref = KeyedScoreTable(capacity), Reference(capacity)
    nbytes = table.nbytes
    for step, batch in enumerate(batches):
        table.clock = step // 3
        keys, losses = [k * 7_919_000_003 for k, _ in batch], [v for _, v in batch]
        if not keys:
            continue
        table.update(torch.tensor(keys), torch.tensor(losses))
        ref.update(keys, losses, step // 3)
        held, values = table.items()
        assert held.tolist() == sorted(ref.scores)
        torch.testing.assert_close(
            values, torch.tensor([ref.scores[k] for k in sorted(ref.scores)]), equal_nan=True
        )
        assert table.count == len(ref.scores) <= capacity and table.evicted == ref.evicted
        assert table.nbytes == nbytes  # memory fixed at construction


def test_memory_is_bounded_by_the_capacity_over_a_long_stream() -> None:
    """A million distinct keys through a table of 4,096: it holds at most 4,096, in the memory it
    was built with, and the keys it holds are the most recently stored."""
    cap = 4096
    table = KeyedScoreTable(cap)
    nbytes = table.nbytes
    assert nbytes == 2 * cap * (8 + 4 + 4) + 4  # keys, stamps (CPU), scores (+ the spare slot)
    for step in range(1000):
        table.clock = step
        keys = torch.arange(step * 1000, (step + 1) * 1000)
        table.update(keys, torch.rand(1000))
        assert table.count <= cap and table.nbytes == nbytes
    held, _ = table.items()
    assert held.min() >= 999_000 - cap and held.max() == 999_999
    assert table.evicted == 1_000_000 - table.count
    assert table.get(torch.tensor([0, 999_999])).isnan().tolist() == [True, False]


def test_state_round_trips_through_torch_load_weights_only() -> None:
    table = KeyedScoreTable(64, ema=0.5, variance=True)
    for step in range(5):
        table.clock = step
        table.update(
            torch.arange(step, step + 20) * 3, torch.rand(20, generator=torch.Generator().manual_seed(step))
        )
    buf = io.BytesIO()
    torch.save(table.state_dict(), buf)
    buf.seek(0)
    other = KeyedScoreTable(40, ema=0.5, variance=True)  # another capacity that holds them
    other.load_state_dict(torch.load(buf, weights_only=True))
    keys = torch.arange(0, 80)
    torch.testing.assert_close(other.get(keys), table.get(keys), equal_nan=True)
    assert [x.tolist() for x in other.items()] == [x.tolist() for x in table.items()]
    assert other.clock == 4 and torch.equal(other.seen(other.lookup(keys)), table.seen(table.lookup(keys)))
    with pytest.raises(ValueError, match="capacity >= 24"):
        KeyedScoreTable(16, ema=0.5, variance=True).load_state_dict(table.state_dict())
    with pytest.raises(ValueError, match="variance"):
        KeyedScoreTable(64).load_state_dict(table.state_dict())


def test_keys_must_be_non_negative_integers() -> None:
    table = KeyedScoreTable(8)
    with pytest.raises(TypeError, match="keys must be a 1-D tensor of integer keys"):
        table.update(torch.tensor([0.5]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="keys must be integers >= 0"):
        table.update(torch.tensor([-1]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="capacity >= 10"):
        table.update(torch.arange(5), torch.ones(5))
    assert table.count == 0 and check_keys([2**62]).tolist() == [2**62]


def test_online_batch_selection_remembers_losses_by_key() -> None:
    """The keyed table is OnlineBatchSelection's memory as it is: the batch's keys are its indices."""
    table = KeyedScoreTable(1024)
    obs = OnlineBatchSelection(score_table=table, keep=0.25, pressure=1e9, seed=0)
    keys = torch.tensor([10**12 + k for k in range(8)])
    losses = torch.tensor([0.1, 5.0, 0.2, 0.3, 4.0, 0.1, 0.2, 0.3])
    obs.record_losses(keys, losses)
    x = torch.arange(8.0)
    sel = obs.select((x, x), progress=0.5, batch_idx=0, indices=keys)
    assert sorted(sel.positions.tolist()) == [1, 4]  # the two largest remembered losses
    fresh = torch.tensor([1, 2, 3, 4, 5, 6, 7, 10**12 + 1])  # never seen: +inf, the hardest
    sel = obs.select((x, x), progress=0.5, batch_idx=1, indices=fresh)
    assert 7 not in sel.positions.tolist()


def part(table: KeyedScoreTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    state = table.state_dict()
    return state["keys"], state["values"], state["stamps"]


def test_merging_the_ranks_tables_keeps_each_keys_last_score_within_the_capacity() -> None:
    """What set_pass does with every rank's table under DDP: the same union on every rank, per key
    the score of the latest pass, the oldest forgotten past the capacity; a key two ranks trained in
    the current pass is refused, nothing changed."""
    ranks = [KeyedScoreTable(6), KeyedScoreTable(6)]
    for t in ranks:
        t.update(torch.tensor([1, 2, 3]), torch.tensor([1.0, 2.0, 3.0]))  # pass 0, on both (merged before)
        t.clock = 1
    ranks[0].update(torch.tensor([2, 7]), torch.tensor([20.0, 70.0]))  # pass 1: each rank its own keys
    ranks[1].update(torch.tensor([3, 8, 9]), torch.tensor([30.0, 80.0, 90.0]))
    ranks[1].update(torch.tensor([5]), torch.tensor([50.0]))
    merged = [KeyedScoreTable(6), KeyedScoreTable(6)]
    for t in merged:
        t.clock = 1
        t.merge([part(r) for r in ranks])
    a, b = merged
    assert [x.tolist() for x in a.items()] == [x.tolist() for x in b.items()]
    keys, values = a.items()
    assert keys.tolist() == [2, 3, 5, 7, 8, 9] and values.tolist() == [20.0, 30.0, 50.0, 70.0, 80.0, 90.0]
    assert a.evicted == 1 and a.get(torch.tensor([1])).isnan().all()  # 7 keys, capacity 6: key 1 (pass 0) goes
    ranks[1].update(torch.tensor([7]), torch.tensor([0.5]))  # both ranks trained key 7 in pass 1
    before = [x.tolist() for x in a.items()]
    with pytest.raises(ValueError, match="ranks 0 and 1 both trained key 7 in pass 1"):
        a.merge([part(r) for r in ranks])
    assert [x.tolist() for x in a.items()] == before
