"""The score table's writes: one code path on every device, defined when an index repeats.

Queued losses are written in bulk. The code that writes them is the same on CPU and on
accelerators (no boolean masks, no value read on the host; ``test_sync_free`` runs it on the
``meta`` device), so these tests, with real values on the CPU, test what CUDA runs.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leanbatch import ScoreTable

NAN, INF = float("nan"), float("inf")


def sequential(n, writes, ema=None):
    """The definition: apply the writes one at a time; a non-finite loss changes nothing."""
    out = [NAN] * n
    for i, v in writes:
        if v == v and abs(v) != INF:
            old = out[i]
            out[i] = v if ema is None or old != old else ema * old + (1 - ema) * v
    return out


def test_the_last_finite_write_of_a_repeated_index_wins():
    t = ScoreTable(5)
    t.update(torch.tensor([1, 3, 1]), torch.tensor([1.0, 2.0, 3.0]))  # repeated inside one update
    t.update(torch.tensor([3, 1, 4]), torch.tensor([NAN, 5.0, INF]))  # and across updates
    t.update(torch.tensor([4, 4]), torch.tensor([6.0, -INF]))
    assert t._pending_n == 8  # all still queued: one flush writes them
    assert t.values.nan_to_num(-1).tolist() == [-1.0, 5.0, -1.0, 2.0, 6.0]
    assert int(t.nonfinite_count) == 3


@given(
    n=st.integers(1, 12),
    writes=st.lists(
        st.tuples(st.integers(0, 11), st.sampled_from([0.5, 1.0, 2.0, 7.25, NAN, INF, -INF])),
        min_size=1,
        max_size=60,
    ),
    flush_every=st.sampled_from([1, 3, 8192]),
    ema=st.sampled_from([None, 0.5]),
)
@settings(max_examples=150, deadline=None)
def test_queued_writes_equal_writing_one_at_a_time(n, writes, flush_every, ema):
    writes = [(i % n, v) for i, v in writes]
    t = ScoreTable(n, ema=ema)
    t.flush_every = flush_every
    for k in range(0, len(writes), 4):  # updates of up to 4 writes, indices may repeat inside
        chunk = writes[k : k + 4]
        t.update(torch.tensor([i for i, _ in chunk]), torch.tensor([v for _, v in chunk]))
    expected = torch.tensor(sequential(n, writes, ema)).nan_to_num(-1)
    got = t.values.nan_to_num(-1)
    if ema is None:
        assert torch.equal(got, expected)
    else:  # EMA flushes every update: writes inside one update blend with the same old score
        assert torch.equal(got == -1, expected == -1)
    assert int(t.nonfinite_count) == sum(1 for _, v in writes if not (v == v and abs(v) != INF))


def test_a_nan_never_replaces_a_score_and_never_scores_a_new_index():
    t = ScoreTable(3)
    t.update(torch.tensor([0]), torch.tensor([1.5]))
    t.flush()  # written
    t.update(torch.tensor([0, 1, 0]), torch.tensor([NAN, NAN, INF]))
    v = t.values
    assert v[0] == 1.5 and torch.isnan(v[1:]).all() and int(t.nonfinite_count) == 3


def test_half_precision_losses_are_stored_as_float32():
    t = ScoreTable(4)
    t.update(torch.arange(4), torch.tensor([0.1, 0.2, 65504.0, 1.0], dtype=torch.float16))
    assert t.values.dtype == torch.float32
    assert t.values[2] == 65504.0 and t.values[0] == pytest.approx(0.1, abs=1e-3)


def test_state_round_trip_and_spare_slot_is_not_part_of_the_table():
    t = ScoreTable(6)
    t.update(torch.tensor([0, 5]), torch.tensor([NAN, 2.0]))
    state = t.state_dict()
    assert state["values"].shape == (6,) and t.values.shape == (6,)
    u = ScoreTable(6)
    u.load_state_dict(state)
    assert torch.equal(u.values.nan_to_num(-1), t.values.nan_to_num(-1)) and u.nonfinite_count == 1
    u.update(torch.tensor([5]), torch.tensor([3.0]))
    assert u.values[5] == 3.0


@given(
    slots=st.lists(st.integers(0, 9), min_size=1, max_size=50),
)
@settings(max_examples=100, deadline=None)
def test_the_devices_path_keeps_the_last_write_of_each_slot_as_the_cpus_does(slots):
    """Where a scatter applies repeated slots in any order (CUDA), the writes are first sorted and each
    given its slot's last value: here run on the CPU, against the one-at-a-time definition."""
    from leanbatch.scores import _last_writes

    slot = torch.tensor(slots)
    new = torch.arange(len(slots), dtype=torch.float32)  # write k carries the value k
    ordered, values = _last_writes(slot, new)
    expected = {}
    for k, s in enumerate(slots):
        expected[s] = float(k)
    assert all(expected[int(s)] == float(v) for s, v in zip(ordered, values, strict=True))
    out = torch.full((10,), -1.0).index_put_((ordered,), values)  # any order: repeated slots agree
    assert out.tolist() == [expected.get(i, -1.0) for i in range(10)]
