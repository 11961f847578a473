"""Sources of scores (leanbatch.selection.sources, proxy): Stale-SB's memory, the memory of last trained
losses (no forward pass), the proxy scorer, and gathers on the meta device."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from selection_helpers import (
    CountingModel,
    conv_net,
    same_state,
    snapshot_all,
)

from leanbatch import ProxyScorer, ScoreTable, SelectiveBackprop
from leanbatch.selection import MemoryScores


def test_stale_sb_skips_the_forward_for_fresh_scores() -> None:
    n = 40
    X, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    idx = torch.arange(n)
    model = CountingModel()
    sb = SelectiveBackprop(scale_factor=1.0, interrupt=0, staleness=2, num_samples=n, loss_fn=F.cross_entropy)
    sb.check((X[:2], y[:2]), model)
    model.seen = 0
    halves = [slice(0, 20), slice(20, 40)]

    def run_epoch(epoch: int) -> int:
        before = model.seen
        for i, s in enumerate(halves):
            out = sb.select(
                (X[s], y[s], idx[s]), model, progress=0.6, batch_idx=i, indices=idx[s], epoch=epoch
            )
            assert out.losses is not None and out.batch[0].shape[0] == 10
        return model.seen - before

    assert run_epoch(0) == n  # all scored
    assert run_epoch(1) == 0  # all fresh: no selection forward at all
    assert run_epoch(2) == n  # stale again
    assert sb.stats.forwarded == 2 * n and sb.stats.reused == n
    # reused losses are the stored ones
    out = sb.select((X[:20], y[:20], idx[:20]), model, progress=0.6, batch_idx=0, indices=idx[:20], epoch=3)
    assert sb.score_table is not None
    assert out.losses is not None and torch.equal(out.losses, sb.score_table.values[:20])
    # a mixed batch forwards only the examples without a fresh score
    sb.record_losses(idx[:5], torch.ones(5), epoch=5)
    before = model.seen
    sb.select((X[:20], y[:20], idx[:20]), model, progress=0.6, batch_idx=0, indices=idx[:20], epoch=5)
    assert model.seen - before == 15


def test_stale_sb_shares_an_existing_score_table() -> None:
    table = ScoreTable(10)
    sb = SelectiveBackprop(scale_factor=1.0, interrupt=0, staleness=3, score_table=table)
    X, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    sb.select((X, y), nn.Linear(4, 3), F.cross_entropy, 0.6, 0, indices=torch.arange(10), epoch=0)
    assert table.num_scored() == 10
    with pytest.raises(ValueError, match="indices"):  # long before the window: not halfway through training
        sb.select((X, y), nn.Linear(4, 3), F.cross_entropy, 0.0, 0)
    with pytest.raises(TypeError, match="progress"):
        sb.select((X, y), nn.Linear(4, 3), F.cross_entropy, torch.tensor(0.6), 0)


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


def test_proxy_scorer_trains_the_proxy_and_leaves_the_main_model_alone() -> None:
    torch.manual_seed(0)
    main, proxy = conv_net(8).train(), conv_net(4)
    main[1].eval()  # a frozen BatchNorm stays frozen
    main(torch.randn(16, 1, 8, 8))  # non-trivial running statistics
    scorer = ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.05), F.cross_entropy)
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, rule="top", scorer=scorer, seed=1)
    snap, proxy_before, replay = snapshot_all(main), snapshot_all(proxy), copy.deepcopy(proxy)
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
    fresh_proxy = conv_net(4)
    other = SelectiveBackprop(
        rule="top",
        scorer=ProxyScorer(fresh_proxy, torch.optim.SGD(fresh_proxy.parameters(), lr=0.05), F.cross_entropy),
    )
    other.load_state_dict(state)
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh_proxy.state_dict().values(), proxy.state_dict().values(), strict=True)
    )
    pre_release = {k: v for k, v in state["scorer"].items() if k != "calls"}  # a state without its call count
    with pytest.raises(ValueError, match="ProxyScorer state_dict has no key 'calls'"):
        other.scorer.load_state_dict(pre_release)


def test_proxy_trains_on_its_own_hardest_share_every_nth_batch() -> None:
    torch.manual_seed(1)
    proxy = nn.Sequential(nn.Flatten(), nn.Linear(16, 10))
    scorer = ProxyScorer(
        proxy, torch.optim.SGD(proxy.parameters(), lr=0.5), F.cross_entropy, train_every=2, train_keep=0.25
    )
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 10, (8,))
    replay = copy.deepcopy(proxy)
    grad_modes: list[bool] = []  # per proxy forward: whether autograd records it
    proxy.register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
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
    assert grad_modes == [True, False, True]  # the batch scored only runs under no_grad
    assert not all(torch.equal(before[k], v) for k, v in proxy.state_dict().items())
    with pytest.raises(ValueError, match="train_every"):
        ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.1), F.cross_entropy, train_every=0)


def test_proxy_selection_and_loss_rank_gathers_run_on_the_meta_device() -> None:
    """Tensors on ``meta`` hold no data: the whole proxy-scored selection step (the proxy's forward,
    backward and optimiser step, the hardest-k rule, the row gather) and the score-table gather of
    online batch selection (with its EMA variance writes) run there, so none reads a value."""
    proxy = conv_net(4).to("meta")
    scorer = ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.1, momentum=0.9), F.cross_entropy)
    main = conv_net(8).to("meta")
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, rule="top", scorer=scorer)
    x, y = torch.empty(16, 1, 8, 8, device="meta"), torch.empty(16, dtype=torch.long, device="meta")
    for step in range(3):
        sel = sb.select((x, y), main, progress=0.5, batch_idx=step)
        assert sel.batch[0].shape == (8, 1, 8, 8) and sel.positions.device.type == "meta"
    table = ScoreTable(100, device="meta", ema=0.9, variance=True)
    idx = torch.randint(0, 100, (16,)).to("meta")
    table.store(idx, torch.empty(16, device="meta"))
    sb_rank = SelectiveBackprop(rule="loss_rank", score_table=table)
    assert isinstance(sb_rank.source, MemoryScores) and sb_rank.source.losses(idx).device.type == "meta"
