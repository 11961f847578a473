"""TokenSelection (RHO-1's selective language modelling): the choice, its twin, schedule, state, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from selection_helpers import forbid_host_reads

from leanbatch import TokenSelection

IGN = -100


def test_keeps_the_top_share_by_excess_loss_as_computed_by_hand():
    tok = torch.tensor([[0.9, 2.0, 1.5, 3.0, 0.1, 4.0], [2.5, 0.3, 5.0, 1.0, 2.2, 0.7]])
    ref = torch.tensor([[0.1, 1.9, 0.2, 0.4, 0.0, 0.5], [0.5, 0.1, 4.9, 0.2, 0.1, 0.6]])
    targets = torch.tensor([[3, 4, IGN, 5, 6, 7], [1, 2, IGN, 3, 4, IGN]])
    # by hand: the labelled tokens and their excess (loss - reference)
    excess = {
        (0, 0): 0.8, (0, 1): 0.1, (0, 3): 2.6, (0, 4): 0.1, (0, 5): 3.5,
        (1, 0): 2.0, (1, 1): 0.2, (1, 3): 0.8, (1, 4): 2.1,
    }  # fmt: skip
    # 9 labelled, keep 0.5 -> int(4.5) = 4: the four largest excesses 3.5, 2.6, 2.1, 2.0
    want = {(0, 5), (0, 3), (1, 4), (1, 0)}
    assert sorted(excess, key=excess.get, reverse=True)[:4] == [(0, 5), (0, 3), (1, 4), (1, 0)]
    kept = TokenSelection(keep=0.5).kept(tok, targets, progress=0.5, reference_loss=ref)
    assert {tuple(i) for i in kept.nonzero().tolist()} == want
    # without a reference: the largest losses 4.0, 3.0, 2.5, 2.2 (the ignored 5.0 and 1.5 never)
    plain = TokenSelection(keep=0.5).kept(tok, targets, progress=0.5)
    assert {tuple(i) for i in plain.nonzero().tolist()} == {(0, 5), (0, 3), (1, 0), (1, 4)}
    top_ignored = TokenSelection(keep=0.2).kept(tok, targets, progress=0.5)  # int(1.8) = 1
    assert top_ignored.nonzero().tolist() == [[0, 5]]


def test_the_loss_is_the_kept_tokens_mean_after_the_causal_shift():
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(3, 7, 13, requires_grad=True), torch.randn(3, 7, 13)
    labels = torch.randint(0, 13, (3, 7))
    labels[0, :3] = IGN  # a prompt
    labels[2, 5:] = IGN  # padding
    ts = TokenSelection(keep=0.4)
    loss = ts.loss(logits, labels, progress=0.5, reference_logits=ref_logits)
    # by hand: shift, per-token losses, excess, the top int(0.4 * n) labelled ones
    targets = torch.cat([labels[:, 1:], torch.full((3, 1), IGN)], dim=1)
    lab = [(r, t) for r in range(3) for t in range(7) if targets[r, t] != IGN]
    ce = lambda lg, r, t: float(F.cross_entropy(lg[r, t : t + 1].double(), targets[r, t : t + 1]))  # noqa: E731
    ex = {(r, t): ce(logits.detach(), r, t) - ce(ref_logits, r, t) for r, t in lab}
    k = max(1, int(0.4 * len(lab)))
    top = sorted(ex, key=ex.get, reverse=True)[:k]
    want = sum(ce(logits.detach(), r, t) for r, t in top) / k
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
    loss.backward()
    grads = {(r, t) for r, t in logits.grad.abs().sum(-1).nonzero().tolist()}
    assert grads == set(top)  # only the kept tokens get a gradient; never an ignored one
    # pre-shifted labels give the same choice and loss; num_items_in_batch divides the sum instead
    again = TokenSelection(keep=0.4).loss(
        logits, shift_labels=targets, progress=0.5, reference_logits=ref_logits
    )
    assert float(again.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    summed = TokenSelection(keep=0.4).loss(
        logits, labels, progress=0.5, reference_logits=ref_logits, num_items_in_batch=torch.tensor(2 * k)
    )
    assert float(summed.detach()) == pytest.approx(want / 2, rel=1e-5)


def test_the_random_twin_keeps_the_same_count_reproducibly_and_leaves_the_global_rng():
    tok = torch.rand(4, 16)
    targets = torch.randint(0, 9, (4, 16))
    targets[:, :5] = IGN
    n = int((targets != IGN).sum())
    method = TokenSelection(keep=0.3).kept(tok, targets, progress=0.5)
    state = torch.get_rng_state()
    draws = [
        TokenSelection(keep=0.3, policy="random", seed=s).kept(tok, targets, progress=0.5) for s in (1, 1, 2)
    ]
    assert torch.equal(torch.get_rng_state(), state)
    for kept in draws:
        assert int(kept.sum()) == int(method.sum()) == int(0.3 * n)
        assert not kept[targets == IGN].any()
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    twin = TokenSelection(keep=0.3, policy="random", seed=1)
    first, second = (twin.kept(tok, targets, progress=0.5) for _ in range(2))
    assert not torch.equal(first, second)  # each batch its own draw
    # uniform: over many draws every labelled token is kept about 30% of the time
    many = torch.stack([twin.kept(tok, targets, progress=0.5) for _ in range(400)]).float().mean(0)
    assert (many[targets != IGN] - 0.3).abs().max() < 0.12 and many[targets == IGN].max() == 0


def test_the_schedule_trains_every_labelled_token_outside_the_window():
    tok, targets = torch.rand(2, 10), torch.randint(0, 5, (2, 10))
    targets[1, 6:] = IGN
    ts = TokenSelection(keep=0.5, start=0.25, end=0.75)
    outside = [ts.kept(tok, targets, progress=p) for p in (0.0, 0.2, 0.75, 1.0)]
    assert all(torch.equal(k, targets != IGN) for k in outside)
    assert int(ts.kept(tok, targets, progress=0.25).sum()) == 8
    assert ts.draws == 1 and ts.batches == 5
    assert ts.counts == {"batches": 5, "labelled": 80, "kept": 72}
    assert torch.equal(TokenSelection(keep=1.0).kept(tok, targets, progress=0.5), targets != IGN)
    assert int(ts.num_kept(targets, 0.5)) == 8 and int(ts.num_kept(targets, 0.9)) == 16
    assert int(ts.num_kept(torch.full((1, 3), IGN), 0.5)) == 0


def test_state_round_trip_resumes_the_draws_and_counts():
    tok, targets = torch.rand(3, 12), torch.randint(0, 5, (3, 12))
    a = TokenSelection(keep=0.5, policy="random", seed=4)
    for _ in range(3):
        a.kept(tok, targets, progress=0.5)
    saved = a.state_dict()
    torch.save(saved, buf := __import__("io").BytesIO())
    buf.seek(0)
    b = TokenSelection(keep=0.5, policy="random", seed=4)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert b.counts == a.counts and b.draws == 3
    assert torch.equal(a.kept(tok, targets, progress=0.5), b.kept(tok, targets, progress=0.5))
    fresh = TokenSelection(keep=0.5, policy="random", seed=4)
    assert not torch.equal(fresh.kept(tok, targets, progress=0.5), b.kept(tok, targets, progress=0.5))
    with pytest.raises(ValueError, match="keep=0.5, policy='random'.*build it with the saved settings"):
        TokenSelection(keep=0.5).load_state_dict(saved)
    with pytest.raises(ValueError, match="has no key 'draws'"):
        TokenSelection(keep=0.5).load_state_dict({})


@pytest.mark.parametrize("keep", [0.0, -0.1, 1.5, float("nan"), "0.5"])
def test_keep_outside_zero_one_is_refused_naming_it(keep):
    with pytest.raises((ValueError, TypeError), match="keep"):
        TokenSelection(keep=keep)


def test_bad_input_is_refused_at_the_first_batch_naming_the_argument():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 6, 11), torch.randint(0, 11, (2, 6))
    ts = TokenSelection(keep=0.5)
    per_sample = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none").mean(1)
    with pytest.raises(ValueError, match=r"token_loss must be per token.*reduction='none'"):
        ts.kept(per_sample, labels, progress=0.5)
    with pytest.raises(ValueError, match=r"token_loss must be per token"):
        ts.kept(per_sample.mean(), labels, progress=0.5)
    with pytest.raises(ValueError, match=r"logits must be a causal LM's per-token logits"):
        ts.loss(logits[:, 0], labels, progress=0.5)
    with pytest.raises(
        ValueError, match=r"reference_logits has a vocabulary of 12 .* share the model's tokenizer"
    ):
        ts.loss(logits, labels, progress=0.5, reference_logits=torch.randn(2, 6, 12))
    with pytest.raises(ValueError, match=r"reference_logits covers \(2, 5\).*same input_ids"):
        ts.loss(logits, labels, progress=0.5, reference_logits=torch.randn(2, 5, 11))
    with pytest.raises(ValueError, match="reference_loss must be .* same input_ids"):
        ts.kept(torch.rand(2, 6), labels, progress=0.5, reference_loss=torch.rand(2, 5))
    with pytest.raises(TypeError, match="exactly one"):
        ts.loss(logits, labels, shift_labels=labels, progress=0.5)
    with pytest.raises(ValueError, match="progress"):
        ts.loss(logits, labels, progress=1.5)
    with pytest.raises(ValueError, match="policy"):
        TokenSelection(policy="top")
    assert ts.batches == 0 and ts.counts["labelled"] == 0  # nothing was counted


def test_a_training_loop_with_token_selection_trains():
    torch.manual_seed(0)
    vocab, seq = 12, 16
    # a learnable language: each token is the previous plus one, modulo the vocabulary
    start = torch.randint(0, vocab, (256, 1))
    data = (start + torch.arange(seq)) % vocab
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    ref = torch.nn.Sequential(
        torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab)
    )  # an untrained reference
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    ts = TokenSelection(keep=0.5)
    losses = []
    for step in range(60):
        x = data[(step * 32) % 256 :][:32]
        with torch.no_grad():
            ref_logits = ref(x)
        loss = ts.loss(model(x), x, progress=step / 60, reference_logits=ref_logits)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    full = F.cross_entropy(model(data[:, :-1]).transpose(1, 2), data[:, 1:])
    assert losses[-1] < 0.3 * losses[0] and float(full.detach()) < 0.5
    assert ts.counts == {"batches": 60, "labelled": 60 * 32 * 15, "kept": 60 * 240}


def test_a_step_reads_nothing_back_from_the_device(monkeypatch):
    torch.manual_seed(0)
    logits, ref, labels = (
        torch.randn(3, 8, 7, requires_grad=True),
        torch.randn(3, 8, 7),
        torch.randint(0, 7, (3, 8)),
    )
    labels[0, :4] = IGN
    excess, twin = TokenSelection(keep=0.5), TokenSelection(keep=0.5, policy="random", seed=1)
    forbid_host_reads(monkeypatch, masks=True)
    for ts in (excess, twin):
        for progress in (0.5, 0.99):
            loss = ts.loss(logits, labels, progress=progress, reference_logits=ref)
            loss.backward()
        ts.num_kept(labels, 0.5)
    monkeypatch.undo()
    assert excess.counts["kept"] == twin.counts["kept"] == 2 * int(0.5 * 18)  # 18 labelled after the shift


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    length=st.integers(1, 12),
    keep=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31 - 1),
    policy=st.sampled_from(["excess", "random"]),
)
def test_invariants_hold_for_any_batch(rows, length, keep, seed, policy):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, 4, (rows, length), generator=g).float()  # ties on purpose
    targets = torch.randint(-1, 5, (rows, length), generator=g)
    targets[targets < 0] = IGN
    labelled = targets != IGN
    n = int(labelled.sum())
    kept = TokenSelection(keep=keep, policy=policy, seed=seed).kept(tok, targets, progress=0.5)
    assert kept.shape == targets.shape and not kept[~labelled].any()
    assert int(kept.sum()) == (0 if n == 0 else max(1, math.floor(keep * n)))
    if policy == "excess" and n and kept.sum() < n:
        assert tok[kept].min() >= tok[labelled & ~kept].max()  # nothing left out scores higher
