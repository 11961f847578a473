"""The selection rules (leanbatch.selection.rules): the rank rule, the loss-rank exponential, top-k and
uniform against exact enumeration, their properties, private generators, and no host reads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from selection_helpers import forbid_host_reads
from test_selection_oracles import exact_inclusion, exact_inclusion_for, loss_rank_formula_weights

from leanbatch import OnlineBatchSelection, SelectiveBackprop, select_by_loss_rank, select_indices
from leanbatch.ranking import pressure_at
from leanbatch.selection import LossRankRule, TopRule, UniformRule
from leanbatch.selection.rules import Draw, num_selected, seed_selection


def select_hardest(losses: torch.Tensor, keep: float) -> torch.Tensor:
    return TopRule(keep).positions(losses, Draw(losses.shape[0], losses.device))


def select_uniform(n: int, keep: float, gen: torch.Generator) -> torch.Tensor:
    return UniformRule(keep).positions(None, Draw(n, torch.device("cpu"), gen))


@pytest.mark.parametrize("n,keep", [(8, 0.5), (7, 0.3)])
def test_inclusion_probability_of_each_rank_matches_the_rule(n: int, keep: float) -> None:
    trials = 12_000
    gen = torch.Generator().manual_seed(1234)
    # losses in shuffled batch positions: inclusion must follow the rank, not the position
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    losses = torch.empty(n).index_copy_(0, perm, torch.arange(n, dtype=torch.float32))
    counts = torch.zeros(n)
    for _ in range(trials):
        counts.index_add_(0, select_indices(losses, keep, gen), torch.ones(num_selected(n, keep)))
    by_rank = counts[perm] / trials  # perm[r] is the position holding rank r
    expected = torch.tensor(exact_inclusion(n, keep))
    sd = (expected * (1 - expected) / trials).sqrt()
    z = (by_rank - expected) / sd
    assert z.abs().max() < 4.5, (by_rank, expected)
    # the test has power: the rule differs from uniform keep and from a deterministic top-k
    uniform = torch.full((n,), num_selected(n, keep) / n)
    assert ((uniform - expected).abs() / sd).max() > 15
    assert by_rank[-1] < 0.9 and by_rank[0] > 0  # not a deterministic top-k
    assert torch.all(by_rank[1:] > by_rank[:-1])  # harder examples are kept more often


@settings(max_examples=60, deadline=None)
@given(
    losses=st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=40),
    keep=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_select_indices_properties(losses: list[float], keep: float, seed: int) -> None:
    x = torch.tensor(losses)
    idx = select_indices(x, keep, torch.Generator().manual_seed(seed))
    k = max(1, int(keep * len(losses)))
    assert idx.dtype == torch.int64 and idx.shape == (k,)
    assert idx.unique().numel() == k and int(idx.min()) >= 0 and int(idx.max()) < len(losses)
    assert torch.equal(idx, idx.sort().values)
    # only the order of the losses matters: exact power-of-two scaling keeps order and ties
    same = select_indices(x * 4.0, keep, torch.Generator().manual_seed(seed))
    assert torch.equal(idx, same)


def test_private_generator_is_deterministic_and_leaves_global_rng_alone() -> None:
    losses = torch.rand(64, generator=torch.Generator().manual_seed(0))
    before = torch.get_rng_state()
    seed_selection(3)
    a = select_indices(losses, 0.5)
    seed_selection(3)
    b = select_indices(losses, 0.5)
    c = select_indices(losses, 0.5)
    assert torch.equal(a, b) and not torch.equal(b, c)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("n,keep,pressure", [(8, 0.5, 20.0), (7, 0.3, 1e3)])
def test_loss_rank_inclusion_matches_exact_enumeration(n: int, keep: float, pressure: float) -> None:
    trials = 12_000
    gen = torch.Generator().manual_seed(4321)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(6))
    losses = torch.empty(n).index_copy_(0, perm, torch.arange(n, dtype=torch.float32))  # rank r at perm[r]
    k = num_selected(n, keep)
    counts = torch.zeros(n)
    for _ in range(trials):
        counts.index_add_(0, select_by_loss_rank(losses, keep, pressure, gen), torch.ones(k))
    by_rank = counts[perm] / trials
    expected = torch.tensor(exact_inclusion_for(loss_rank_formula_weights(n, pressure), k))
    sd = (expected * (1 - expected) / trials).sqrt()
    assert ((by_rank - expected) / sd).abs().max() < 4.5, (by_rank, expected)
    # power: the rule differs from uniform selection and from Composer's rank rule at this keep
    assert ((torch.full((n,), k / n) - expected).abs() / sd).max() > 15
    assert ((torch.tensor(exact_inclusion(n, keep)) - expected).abs() / sd).max() > 10


def test_loss_rank_breaks_ties_at_random_and_counts_unscored_as_hardest() -> None:
    n, trials, k = 6, 6000, 3
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(n)
    for _ in range(trials):  # every loss unknown (the first epoch): a uniform choice, whatever the position
        counts.index_add_(
            0, select_by_loss_rank(torch.full((n,), float("nan")), 0.5, 100.0, gen), torch.ones(k)
        )
    sd = (0.5 * 0.5 / trials) ** 0.5
    assert ((counts / trials - 0.5).abs() / sd).max() < 4.5
    losses = torch.tensor([0.1, float("nan"), 0.2, 0.3, 0.05, 0.4])
    hits = torch.zeros(n)
    for _ in range(2000):
        hits.index_add_(0, select_by_loss_rank(losses, 0.5, 1e6, gen), torch.ones(k))
    assert hits[1] == 2000 and hits[5] > hits[3] > hits[0]  # unscored first, then by loss


@given(
    losses=st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(float("nan"))), min_size=1, max_size=40),
    keep=st.floats(0.01, 1.0),
    pressure=st.floats(1.0, 1e12),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=150, deadline=None)
def test_fixed_k_rules_return_k_distinct_sorted_positions(losses, keep, pressure, seed) -> None:
    t = torch.tensor(losses, dtype=torch.float32)
    k = num_selected(len(losses), keep)
    for pos in (
        select_by_loss_rank(t, keep, pressure, torch.Generator().manual_seed(seed)),
        select_hardest(t, keep),
    ):
        assert pos.shape == (k,) and pos.dtype == torch.int64
        assert bool((pos[1:] > pos[:-1]).all()) and int(pos.min()) >= 0 and int(pos.max()) < len(losses)
    hardest = select_hardest(t, keep)
    if k < len(losses):  # nothing left out is harder than what is kept (NaN counts as hardest)
        hard = torch.nan_to_num(t, nan=float("inf"))
        out = torch.ones(len(losses), dtype=torch.bool)
        out[hardest] = False
        assert float(hard[out].max()) <= float(hard[hardest].min())


def test_hardest_rule_keeps_the_top_losses() -> None:
    losses = torch.tensor([0.3, 2.0, float("nan"), 0.1, 1.0, 0.5])
    assert select_hardest(losses, 0.5).tolist() == [1, 2, 4]
    assert select_hardest(losses, 1.0).tolist() == list(range(6))


def test_selection_paths_read_no_tensor_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU stand-in for CUDA's no-host-sync rule: every Python read of a tensor value raises
    inside the rules' per-step code."""
    losses = torch.rand(64)
    gen = torch.Generator().manual_seed(0)
    forbid_host_reads(monkeypatch)
    a = select_by_loss_rank(losses, 0.5, 100.0, gen)
    b = select_hardest(losses, 0.5)
    monkeypatch.undo()
    assert a.shape == (32,) and b.shape == (32,)


# ---------------------------------------------------------------------------- the uniform twin
@pytest.mark.parametrize("n,keep", [(8, 0.5), (7, 0.3)])
def test_uniform_rule_keeps_every_row_equally_often(n: int, keep: float) -> None:
    trials, k = 12_000, num_selected(n, keep)
    gen = torch.Generator().manual_seed(99)
    counts = torch.zeros(n)
    for _ in range(trials):
        counts.index_add_(0, select_uniform(n, keep, gen), torch.ones(k))
    freq, p = counts / trials, k / n
    sd = (p * (1 - p) / trials) ** 0.5
    assert ((freq - p).abs() / sd).max() < 4.5, freq
    # power: the rank rule's inclusion probabilities at this keep are far from uniform
    assert ((torch.tensor(exact_inclusion(n, keep)) - p).abs() / sd).max() > 15


@given(n=st.integers(1, 60), keep=st.floats(0.01, 1.0), seed=st.integers(0, 2**31))
@settings(max_examples=100, deadline=None)
def test_uniform_rule_returns_k_distinct_sorted_positions(n: int, keep: float, seed: int) -> None:
    pos = select_uniform(n, keep, torch.Generator().manual_seed(seed))
    k = num_selected(n, keep)
    assert pos.shape == (k,) and pos.dtype == torch.int64
    assert bool((pos[1:] > pos[:-1]).all()) and int(pos.min()) >= 0 and int(pos.max()) < n
    again = select_uniform(n, keep, torch.Generator().manual_seed(seed))
    assert torch.equal(pos, again)  # a pure function of the generator's state


def test_uniform_rule_reads_no_tensor_value(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    forbid_host_reads(monkeypatch)
    pos = UniformRule(0.25).positions(None, Draw(64, torch.device("cpu"), gen))
    monkeypatch.undo()
    assert pos.shape == (16,)


# ---------------------------------------------------------------------------- bad pressure
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0.5, True])
def test_every_entry_point_refuses_a_pressure_that_is_not_finite_and_at_least_one(bad: float) -> None:
    losses = torch.rand(6)
    calls = [
        lambda: pressure_at(0.5, bad),
        lambda: pressure_at(0.5, 100.0, bad),
        lambda: select_by_loss_rank(losses, 0.5, bad, torch.Generator()),
        lambda: LossRankRule(0.5, bad),
        lambda: LossRankRule(0.5, 100.0, final_pressure=bad),
        lambda: SelectiveBackprop(rule="loss_rank", num_samples=6, selection_pressure=bad),
        lambda: SelectiveBackprop(rule="loss_rank", num_samples=6, final_pressure=bad),
        lambda: OnlineBatchSelection(6, pressure=bad),
        lambda: OnlineBatchSelection(6, final_pressure=bad),
    ]
    for call in calls:
        with pytest.raises(
            ValueError, match=r"(selection_pressure|final_pressure|pressure) must be a finite number >= 1"
        ):
            call()
