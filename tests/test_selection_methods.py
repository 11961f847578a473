"""Online batch selection by loss rank, the hardest-k rule and the proxy scorer: inclusion
probabilities against exact enumeration, no forward pass where none is promised, the main
model's BatchNorm state and modes untouched, and no host reads in the per-step path."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_selection_oracles import exact_inclusion, exact_inclusion_for, loss_rank_formula_weights

from leanbatch.scores import ScoreTable
from leanbatch.selection import (
    ProxyScorer,
    SelectiveBackprop,
    loss_rank_weights,
    num_selected,
    select_by_loss_rank,
    select_hardest,
)


def cnn(width: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10),
    )  # fmt: skip


def snapshot(model: nn.Module) -> tuple[list[torch.Tensor], list[bool]]:
    return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]], [
        m.training for m in model.modules()
    ]


def same_state(model: nn.Module, snap: tuple[list[torch.Tensor], list[bool]]) -> bool:
    tensors, modes = snap
    now = [*model.parameters(), *model.buffers()]
    return all(torch.equal(a, b) for a, b in zip(tensors, now, strict=True)) and modes == [
        m.training for m in model.modules()
    ]


# ---------------------------------------------------------------------------- online batch selection
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
    w = loss_rank_weights(n, pressure)
    assert torch.allclose(
        w,
        torch.tensor(loss_rank_formula_weights(n, pressure), dtype=torch.float64)
        / sum(loss_rank_formula_weights(n, pressure)),
    )


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


def test_loss_rank_selection_reads_the_table_and_runs_no_forward_pass() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("online batch selection must not run the model")

    table = ScoreTable(100)
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.25, interrupt=0, rule="loss_rank", score_table=table,
                           selection_pressure=1e9, seed=0)  # fmt: skip
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 10, (8,))
    idx = torch.arange(10, 18)
    sb.record_losses(idx[:6], torch.tensor([0.1, 0.2, 5.0, 0.3, 4.0, 0.4]))  # 16 and 17: never scored
    sel = sb.select((x, y), Boom(), progress=0.3, batch_idx=0, indices=idx)
    assert sel.positions.tolist() == [6, 7]  # k = 2: the two unknown losses rank first
    sb.record_losses(idx[6:], torch.tensor([0.01, 0.02]))
    assert sb.select((x, y), Boom(), progress=0.3, batch_idx=1, indices=idx).positions.tolist() == [2, 4]
    assert sb.stats.forwarded == 0 and sb.stats.reused == 16 and sb.stats.backpropagated == 4
    with pytest.raises(ValueError, match="indices"):
        sb.select((x, y), Boom(), progress=0.3, batch_idx=2)


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


# ---------------------------------------------------------------------------- the proxy scorer
def test_proxy_scorer_trains_the_proxy_and_leaves_the_main_model_alone() -> None:
    torch.manual_seed(0)
    main, proxy = cnn(8).train(), cnn(4)
    main[1].eval()  # a frozen BatchNorm stays frozen
    main(torch.randn(16, 1, 8, 8))  # non-trivial running statistics
    scorer = ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.05), F.cross_entropy)
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, rule="top", scorer=scorer, seed=1)
    snap, proxy_before, replay = snapshot(main), snapshot(proxy), copy.deepcopy(proxy)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    sel = sb.select((x, y), main, progress=0.1, batch_idx=0)  # no loss function needed: the proxy has its own
    assert same_state(main, snap) and all(p.grad is None for p in main.parameters())
    assert not same_state(proxy, proxy_before) and scorer.steps == 1  # one training step per scored batch
    with torch.no_grad():  # the losses are the proxy's before its step (train mode, as it trains)
        expected = F.cross_entropy(replay.train()(x), y, reduction="none")
    assert torch.allclose(sel.losses, expected, atol=1e-6)
    assert sel.positions.tolist() == torch.sort(torch.topk(expected, 8).indices).values.tolist()
    state = sb.state_dict()
    assert state["scorer"]["steps"] == 1
    fresh_proxy = cnn(4)
    other = SelectiveBackprop(
        rule="top",
        scorer=ProxyScorer(fresh_proxy, torch.optim.SGD(fresh_proxy.parameters(), lr=0.05), F.cross_entropy),
    )
    other.load_state_dict(state)
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh_proxy.state_dict().values(), proxy.state_dict().values(), strict=True)
    )


def test_proxy_trains_on_its_own_hardest_share_every_nth_batch() -> None:
    torch.manual_seed(1)
    proxy = nn.Sequential(nn.Flatten(), nn.Linear(16, 10))
    scorer = ProxyScorer(
        proxy, torch.optim.SGD(proxy.parameters(), lr=0.5), F.cross_entropy, train_every=2, train_keep=0.25
    )
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 10, (8,))
    replay = copy.deepcopy(proxy)
    losses = scorer(x, y)  # call 0: a step on the hardest 2 of 8
    manual = F.cross_entropy(replay(x), y, reduction="none")
    hard = torch.topk(manual.detach(), 2).indices
    manual[hard].mean().backward()
    with torch.no_grad():
        for p in replay.parameters():
            p -= 0.5 * p.grad
    assert torch.allclose(losses, manual.detach(), atol=1e-6)
    assert all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(proxy.parameters(), replay.parameters(), strict=True)
    )
    before = copy.deepcopy(proxy.state_dict())
    scorer(x, y)  # call 1: scored only
    assert all(torch.equal(before[k], v) for k, v in proxy.state_dict().items())
    scorer(x, y)  # call 2: a step again
    assert scorer.steps == 2 and scorer.calls == 3
    assert not all(torch.equal(before[k], v) for k, v in proxy.state_dict().items())
    with pytest.raises(ValueError, match="train_every"):
        ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.1), F.cross_entropy, train_every=0)


def test_selection_paths_read_no_tensor_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU stand-in for CUDA's no-host-sync rule (as tests/test_selection.py): every Python read of a
    tensor value raises inside the new rules' per-step code."""
    losses = torch.rand(64)
    reads = ["item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"]

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("host read of a tensor value in the per-step path")

    gen = torch.Generator().manual_seed(0)
    for name in reads:
        monkeypatch.setattr(torch.Tensor, name, boom)
    monkeypatch.setattr(torch, "nonzero", boom)
    a = select_by_loss_rank(losses, 0.5, 100.0, gen)
    b = select_hardest(losses, 0.5)
    monkeypatch.undo()
    assert a.shape == (32,) and b.shape == (32,)


def test_proxy_selection_and_loss_rank_gathers_run_on_the_meta_device() -> None:
    """Tensors on ``meta`` hold no data: the whole proxy-scored selection step (the proxy's forward,
    backward and optimiser step, the hardest-k rule, the row gather) and the score-table gather of
    online batch selection (with its EMA variance writes) run there, so none reads a value."""
    proxy = cnn(4).to("meta")
    scorer = ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.1, momentum=0.9), F.cross_entropy)
    main = cnn(8).to("meta")
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, rule="top", scorer=scorer)
    x, y = torch.empty(16, 1, 8, 8, device="meta"), torch.empty(16, dtype=torch.long, device="meta")
    for step in range(3):
        sel = sb.select((x, y), main, progress=0.5, batch_idx=step)
        assert sel.batch[0].shape == (8, 1, 8, 8) and sel.positions.device.type == "meta"
    table = ScoreTable(100, device="meta", ema=0.9, variance=True)
    idx = torch.randint(0, 100, (16,)).to("meta")
    table.store(idx, torch.empty(16, device="meta"))
    sb_rank = SelectiveBackprop(rule="loss_rank", score_table=table)
    assert sb_rank._stale is not None and sb_rank._stale.losses(idx).device.type == "meta"


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(rule="loss_rank"), ValueError, "num_samples"),
        (dict(rule="loss_rank", num_samples=10, staleness=2), ValueError, "staleness"),
        (dict(rule="loss_rank", num_samples=10, selection_pressure=0.5), ValueError, "selection_pressure"),
        (dict(rule="loss_rank", num_samples=10, final_pressure=float("inf")), ValueError, "final_pressure"),
        (dict(rule="fastest"), ValueError, "rule"),
        (dict(scorer="proxy"), TypeError, "scorer"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        SelectiveBackprop(**kwargs)
