"""Selective Backprop: the rank rule's distribution, state preservation, batch shapes, bad inputs."""

from __future__ import annotations

import io
import math
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_selection_oracles import exact_inclusion  # from the formula, not from rank_weights

from leanbatch.scores import ScoreTable
from leanbatch.selection import (
    BatchAccumulator,
    LossHistory,
    SelectiveBackprop,
    num_selected,
    per_sequence_loss,
    rank_weights,
    seed_selection,
    select_indices,
    select_using_loss,
    selection_losses,
    should_selective_backprop,
    training_progress,
)
from leanbatch.selection.batches import concat_batches, index_batch, slice_batch


def cnn(c_in: int = 1, n_cls: int = 10, dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(c_in, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(16, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, n_cls),
    )


# ---------------------------------------------------------------------------- the rank rule
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


def test_rank_weights_are_the_composer_formula() -> None:
    n, keep = 10, 0.25
    p = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    w = p ** (1 / keep - 1)
    assert torch.allclose(rank_weights(n, keep), w / w.sum())


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


def test_select_using_loss_keeps_rows_aligned_and_favours_high_loss() -> None:
    torch.manual_seed(0)
    n = 64
    X = torch.randn(n, 1, 8, 8)
    y = torch.arange(n)  # row id as the target
    # a "model" whose output encodes the row's id; the loss is larger for larger ids
    model = lambda x: x.flatten(1)[:, :1]  # noqa: E731
    row_id = X.flatten(1)[:, :1]

    def loss_fun(out: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        assert reduction == "none"
        return target.float() + 0 * out[:, 0]

    hits = torch.zeros(n)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        X_new, y_new = select_using_loss(
            X, y, model, loss_fun, 0.5, 1, generator=g
        )  # Composer's positional form
        assert X_new.shape == (32, 1, 8, 8) and y_new.shape == (32,)
        assert torch.equal(X_new.flatten(1)[:, :1], row_id[y_new])  # X and y rows still belong together
        hits[y_new] += 1
    assert hits[48:].mean() > 2.5 * hits[:16].mean()


# ---------------------------------------------------------------------------- training state
def snapshot(model: nn.Module) -> tuple[list[torch.Tensor], list[bool]]:
    return [b.clone() for b in model.buffers()], [m.training for m in model.modules()]


def assert_same_state(model: nn.Module, snap: tuple[list[torch.Tensor], list[bool]]) -> None:
    bufs, modes = snap
    assert all(torch.equal(a, b) for a, b in zip(bufs, model.buffers(), strict=True))
    assert modes == [m.training for m in model.modules()]


@pytest.mark.parametrize("eval_mode", [False, True])
@pytest.mark.parametrize("frozen_bn", [False, True])
def test_selection_leaves_bn_statistics_modes_and_grads_untouched(eval_mode: bool, frozen_bn: bool) -> None:
    torch.manual_seed(0)
    model = cnn(dropout=0.1).train()
    if frozen_bn:
        model[1].eval()  # a frozen BatchNorm layer must stay frozen
    X, y = torch.randn(32, 1, 16, 16) * 3 + 1, torch.randint(0, 10, (32,))
    model(X)  # non-trivial running statistics
    snap = snapshot(model)
    X_new, y_new = select_using_loss(
        X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5, eval_mode=eval_mode
    )
    assert_same_state(model, snap)
    assert all(p.grad is None for p in model.parameters())
    assert not X_new.requires_grad
    losses = selection_losses(X, y, model, F.cross_entropy, 0.5, chunk_size=5, eval_mode=eval_mode)
    assert losses.shape == (32,) and losses.dtype == torch.float32 and not losses.requires_grad
    assert_same_state(model, snap)
    model.eval()
    snap = snapshot(model)
    select_using_loss(X, y, model, F.cross_entropy, keep=0.5)
    assert_same_state(model, snap)


def test_selective_backprop_object_leaves_state_untouched_including_first_call_check() -> None:
    torch.manual_seed(0)
    model = cnn().train()
    batch = (torch.randn(16, 1, 12, 12), torch.randint(0, 10, (16,)))
    model(batch[0])
    snap = snapshot(model)
    sb = SelectiveBackprop(interrupt=0)
    for progress in (0.1, 0.6):  # the first call runs the dry check even outside the window
        sb.select(batch, model, F.cross_entropy, progress=progress, batch_idx=0)
        assert_same_state(model, snap)


def test_chunked_losses_equal_unchunked_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = cnn().eval()
    X, y = torch.randn(23, 1, 10, 10), torch.randint(0, 10, (23,))
    whole = selection_losses(X, y, model, F.cross_entropy)
    chunked = selection_losses(X, y, model, F.cross_entropy, chunk_size=4)
    assert torch.allclose(whole, chunked, atol=1e-5)


def test_selection_runs_under_the_requested_precision() -> None:
    seen: list[torch.dtype] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.lin(x)
            seen.append(out.dtype)
            return out

    X, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    select_using_loss(X, y, Probe(), F.cross_entropy, keep=0.5, autocast=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        select_using_loss(X, y, Probe(), F.cross_entropy, keep=0.5)  # inherits the caller's context
        select_using_loss(X, y, Probe(), F.cross_entropy, keep=0.5, autocast=False)
    assert seen == [torch.bfloat16, torch.bfloat16, torch.float32]


_READS = ["item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"]


def test_per_step_path_makes_no_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU stand-in for torch.cuda.set_sync_debug_mode('error'): every Python-level read of a
    tensor value (item, tolist, bool(), nonzero, boolean-mask indexing) raises inside selection."""
    model = cnn().train()
    X, y = torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,))
    sb = SelectiveBackprop(interrupt=0, loss_fn=F.cross_entropy)
    sb.check((X, y), model)  # one-off, not per step

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("host read of a tensor value in the per-step path")

    getitem = torch.Tensor.__getitem__

    def guarded_getitem(self: torch.Tensor, key: object) -> torch.Tensor:
        if isinstance(key, torch.Tensor) and key.dtype == torch.bool:
            boom()
        return getitem(self, key)

    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, boom)
    monkeypatch.setattr(torch.Tensor, "__getitem__", guarded_getitem)
    monkeypatch.setattr(torch, "nonzero", boom)
    X_new, _ = select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
    sel = sb.select((X, y), model, progress=0.7, batch_idx=0)
    # Composer's inputs too: a dict X given whole to the model, an integer loss
    X_dict, y_dict = select_using_loss(
        {"x": X, "tag": "t"}, y, lambda d: model(d["x"]), lambda o, t, reduction="none": t, keep=0.5
    )
    monkeypatch.undo()
    assert X_new.shape[0] == 16 and sel.batch[0].shape[0] == 16
    assert X_dict["x"].shape[0] == 16 and X_dict["tag"] == "t" and y_dict.shape == (16,)


# ---------------------------------------------------------------------------- batch shapes
class TinyLM(nn.Module):
    """Hugging Face-like: keyword inputs, returns an object with .logits."""

    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return SimpleNamespace(logits=self.head(h))


def test_dict_batch_with_token_labels() -> None:
    torch.manual_seed(0)
    n, t = 12, 7
    ids = torch.randint(0, 11, (n, t))
    mask = torch.ones(n, t, dtype=torch.long)
    labels = ids.clone()
    labels[:, :2] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels, "source": "toy"}
    sb = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0)
    out = sb.select(batch, TinyLM(), per_sequence_loss, progress=0.6, batch_idx=0)
    assert set(out.batch) == set(batch) and out.batch["source"] == "toy"
    assert out.batch["input_ids"].shape == (6, t) and out.losses is not None and out.losses.shape == (n,)
    assert out.positions is not None
    assert torch.equal(out.batch["labels"], labels[out.positions])
    assert torch.equal(out.batch["input_ids"], ids[out.positions])


def test_dict_batch_rejects_downsampling_on_first_call() -> None:
    batch = {
        "input_ids": torch.randint(0, 11, (4, 5)),
        "attention_mask": torch.ones(4, 5, dtype=torch.long),
        "labels": torch.randint(0, 11, (4, 5)),
    }
    sb = SelectiveBackprop()  # scale_factor=0.5 by default: token ids cannot be downsampled
    with pytest.raises(ValueError, match="scale_factor"):
        sb.select(batch, TinyLM(), per_sequence_loss, progress=0.0, batch_idx=0)  # long before the window


def test_per_sequence_loss_matches_a_masked_mean() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    labels = torch.randint(0, 7, (3, 5))
    labels[0, 3:] = -100
    labels[2, :] = -100
    got = per_sequence_loss(logits, labels)
    for i in range(3):
        keep = labels[i] != -100
        want = F.cross_entropy(logits[i][keep], labels[i][keep]) if keep.any() else torch.tensor(0.0)
        assert torch.allclose(got[i], want, atol=1e-6)
    shifted = per_sequence_loss(logits, labels, shift=True)
    assert torch.allclose(shifted, per_sequence_loss(logits[:, :-1], labels[:, 1:]))
    assert torch.allclose(per_sequence_loss(logits, labels, reduction="mean"), got.mean())


def test_tuple_batch_carries_indices_and_weights_along() -> None:
    torch.manual_seed(0)
    n = 20
    X, y = torch.randn(n, 1, 8, 8), torch.randint(0, 10, (n,))
    idx = torch.arange(100, 100 + n)
    w = torch.linspace(1, 2, n)  # e.g. InfoBatch loss weights
    sb = SelectiveBackprop(interrupt=0, keep=0.25)
    (Xs, ys, idxs, ws), pos, losses = sb.select((X, y, idx, w), cnn(), F.cross_entropy, 0.6, 0)
    assert pos is not None and losses is not None
    assert torch.equal(idxs, idx[pos]) and torch.equal(ws, w[pos]) and torch.equal(Xs, X[pos])


def test_bare_tensor_batch_is_input_and_target() -> None:
    def recon(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return F.mse_loss(out, target, reduction="none").flatten(1).mean(1)

    X = torch.randn(10, 1, 4, 4)
    X[7] *= 10  # by far the worst reconstruction of a model that outputs zeros
    zeros = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.Unflatten(1, (1, 4, 4)))
    nn.init.zeros_(zeros[1].weight)
    nn.init.zeros_(zeros[1].bias)
    sb = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0)
    out = sb.select(X, zeros, recon, progress=0.5, batch_idx=0)
    assert out.losses is not None and out.positions is not None
    # the batch was the target too: each loss is the row's mean square, i.e. |X - 0|^2
    assert torch.allclose(out.losses, X.pow(2).flatten(1).mean(1))
    assert isinstance(out.batch, torch.Tensor) and torch.equal(out.batch, X[out.positions])
    assert out.positions.shape == (5,)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_slicing_and_concatenating_batches_round_trips(sizes: list[int]) -> None:
    total = sum(sizes)
    batch = {"x": torch.arange(total * 2).view(total, 2), "y": (torch.arange(total), "meta")}
    parts, start = [], 0
    for s in sizes:
        parts.append(slice_batch(batch, start, start + s, total))
        start += s
    whole = concat_batches(parts, sizes)
    assert torch.equal(whole["x"], batch["x"]) and torch.equal(whole["y"][0], batch["y"][0])
    assert whole["y"][1] == "meta"
    acc = BatchAccumulator(4)
    for p, s in zip(parts, sizes, strict=True):
        acc.add(p, s)
    out = []
    while (b := acc.pop()) is not None:
        out.append(b["y"][0])
    rest = acc.flush()
    if rest is not None:
        out.append(rest["y"][0])
    assert torch.equal(torch.cat(out), torch.arange(total)) and all(len(o) == 4 for o in out[:-1])


def test_index_batch_keeps_namedtuples_and_other_lengths() -> None:
    from collections import namedtuple

    B = namedtuple("B", "x y classes")
    b = B(torch.arange(6), torch.arange(6) * 2, torch.arange(10))
    out = index_batch(b, torch.tensor([0, 5]), 6)
    assert isinstance(out, B) and out.y.tolist() == [0, 10] and out.classes.shape == (10,)


# ---------------------------------------------------------------------------- schedule
def test_interrupt_semantics_match_composer_code() -> None:
    sb = SelectiveBackprop(start=0.5, end=0.9, interrupt=3)
    assert [sb.is_active(0.6, i) for i in range(6)] == [True, True, False, True, True, False]
    assert [SelectiveBackprop(interrupt=2).is_active(0.6, i) for i in range(4)] == [True, False, True, False]
    assert all(SelectiveBackprop(interrupt=0).is_active(0.6, i) for i in range(5))
    assert not sb.is_active(0.49, 0) and sb.is_active(0.5, 0) and not sb.is_active(0.9, 0)
    assert not SelectiveBackprop(keep=1.0).is_active(0.6, 0)  # keep=1: nothing to select
    with pytest.warns(UserWarning, match="interrupt=1"):
        never = SelectiveBackprop(interrupt=1)
    assert not any(never.is_active(0.6, i) for i in range(5))
    # the whole (progress, batch) table, written out: window [0.5, 0.9), every third batch vanilla
    on = [True, True, False, True, True, False, True]
    off = [False] * 7
    expected = {0.0: off, 0.3: off, 0.4999: off, 0.5: on, 0.7: on, 0.8999: on, 0.9: off, 0.95: off}
    assert {p: [sb.is_active(p, i) for i in range(7)] for p in expected} == expected
    assert {p: [should_selective_backprop(p, i, 0.5, 0.9, 3) for i in range(7)] for p in expected} == expected
    rank_keep1 = SelectiveBackprop(keep=1.0, interrupt=0)
    history_keep1 = SelectiveBackprop(keep=1.0, interrupt=0, rule="history")  # keep does not apply to it
    assert [rank_keep1.is_active(0.6, i) for i in range(3)] == [False] * 3
    assert [history_keep1.is_active(0.6, i) for i in range(3)] == [True] * 3


def test_training_progress_from_epochs_or_steps() -> None:
    assert training_progress(epoch=2, num_epochs=4) == 0.5
    assert training_progress(epoch=2, num_epochs=4, batch_idx=5, batches_per_epoch=10) == 0.625
    assert training_progress(step=30, total_steps=40) == 0.75
    with pytest.raises(TypeError):
        training_progress(step=3)


def test_batch_of_one_still_trains() -> None:
    model = cnn().eval()
    X, y = torch.randn(1, 1, 8, 8), torch.randint(0, 10, (1,))
    X1, y1 = select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
    assert X1.shape[0] == 1 and y1.shape[0] == 1
    X3, y3 = torch.randn(3, 1, 8, 8), torch.randint(0, 10, (3,))
    assert select_using_loss(X3, y3, model, F.cross_entropy, keep=0.3)[0].shape[0] == 1  # Composer: 0
    sb = SelectiveBackprop(interrupt=0)
    out = sb.select((X, y), model, F.cross_entropy, progress=0.6, batch_idx=0)
    assert out.batch[0].shape[0] == 1


# ---------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        ({"keep": 0.0}, ValueError, "keep"),
        ({"keep": 1.5}, ValueError, "keep"),
        ({"keep": -0.2}, ValueError, "keep"),
        ({"keep": math.nan}, ValueError, "keep"),
        ({"keep": "0.5"}, TypeError, "keep"),
        ({"keep": True}, TypeError, "keep"),
        ({"scale_factor": 0.0}, ValueError, "scale_factor"),
        ({"scale_factor": 2.0}, ValueError, "scale_factor"),
        ({"start": 0.9, "end": 0.5}, ValueError, "start"),
        ({"start": 0.5, "end": 0.5}, ValueError, "start"),
        ({"start": -0.1}, ValueError, "start"),
        ({"end": None}, TypeError, "end"),
        ({"interrupt": -1}, ValueError, "interrupt"),
        ({"interrupt": 2.0}, TypeError, "interrupt"),
        ({"rule": "loss"}, ValueError, "rule"),
        ({"rule": "history", "beta": 0.0}, ValueError, "beta"),
        ({"rule": "history", "history_size": 0}, ValueError, "history_size"),
        ({"staleness": 0}, ValueError, "staleness"),
        ({"staleness": 2}, ValueError, "num_samples"),
        ({"num_samples": 10}, ValueError, "staleness"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"autocast": torch.float32}, TypeError, "autocast"),
        ({"loss_fn": lambda out, target: out.sum()}, TypeError, "reduction"),
        ({"loss_fn": "cross_entropy"}, TypeError, "loss_fn"),
        ({"input_key": 1.5}, TypeError, "input_key"),
    ],
)
def test_bad_hyperparameters_fail_at_construction(kwargs: dict, exc: type, name: str) -> None:
    with pytest.raises(exc, match=name):
        SelectiveBackprop(**kwargs)


def test_select_using_loss_bad_inputs() -> None:
    model = cnn().eval()
    X, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    flat = torch.randn(8, 64)
    lin = nn.Linear(64, 10)
    with pytest.raises(ValueError, match="keep"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0)
    with pytest.raises(ValueError, match="scale_factor"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=1.5)
    with pytest.raises(ValueError, match="scale_factor"):  # 2-D input cannot be downsampled
        select_using_loss(flat, y, lin, F.cross_entropy, keep=0.5, scale_factor=0.5)
    with pytest.raises(ValueError, match="scale_factor"):  # integer images neither
        select_using_loss(X.long(), y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
    with pytest.raises(TypeError, match="reduction"):
        select_using_loss(X, y, model, lambda out, target: F.cross_entropy(out, target), keep=0.5)
    with pytest.raises(ValueError, match="one loss per example"):  # ignores reduction: a scalar
        select_using_loss(
            X, y, model, lambda out, target, reduction="mean": F.cross_entropy(out, target), 0.5
        )
    with pytest.raises(ValueError, match="per_sequence_loss"):
        select_using_loss(X, y, model, lambda o, t, reduction="none": o, keep=0.5)
    with pytest.raises(ValueError, match="y must"):
        select_using_loss(X, y[:5], model, F.cross_entropy, keep=0.5)
    with pytest.raises(TypeError, match="X must"):
        select_using_loss([1, 2], y, model, F.cross_entropy, keep=0.5)
    with pytest.raises(TypeError, match="generator"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0.5, generator=0)
    with pytest.raises(ValueError, match="losses"):
        select_indices(torch.ones(3, 2), 0.5)
    # a loss module is adapted, not rejected
    assert select_using_loss(X, y, model, nn.CrossEntropyLoss(), keep=0.5)[0].shape[0] == 4


def test_selective_backprop_bad_batches_fail_on_the_first_call() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    flat_batch = (torch.randn(8, 64), torch.randint(0, 10, (8,)))
    with pytest.raises(ValueError, match="scale_factor"):
        SelectiveBackprop().select(flat_batch, model, F.cross_entropy, progress=0.0, batch_idx=0)
    with pytest.raises(ValueError, match="one loss per example"):
        SelectiveBackprop(scale_factor=1.0).select(
            flat_batch, model, lambda o, t, reduction="none": o.sum(), progress=0.0, batch_idx=0
        )
    with pytest.raises(ValueError, match="target"):
        SelectiveBackprop(scale_factor=1.0).select(
            (torch.randn(8, 64), torch.zeros(3)), model, F.cross_entropy, progress=0.0, batch_idx=0
        )
    with pytest.raises(ValueError, match="target_key"):
        SelectiveBackprop(scale_factor=1.0).select({"x": flat_batch[0]}, model, F.cross_entropy, 0.0, 0)
    with pytest.raises(TypeError, match="batch"):
        SelectiveBackprop(scale_factor=1.0).select(3, model, F.cross_entropy, progress=0.0, batch_idx=0)
    with pytest.raises(TypeError, match="progress"):
        SelectiveBackprop(scale_factor=1.0).select(flat_batch, model, F.cross_entropy)
    with pytest.raises(TypeError, match="loss"):
        SelectiveBackprop(scale_factor=1.0).select(flat_batch, model, progress=0.0, batch_idx=0)


def test_no_warning_for_valid_defaults() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SelectiveBackprop()


# ---------------------------------------------------------------------------- the paper's rule
def brute_percentile(history: list[float], x: float) -> float:
    below = sum(h < x for h in history)
    at = sum(h == x for h in history)
    return (2 * below + at + (1 if at else 0)) / (2 * len(history))


@settings(max_examples=50, deadline=None)
@given(
    history=st.lists(st.integers(0, 6).map(float), min_size=1, max_size=30),
    queries=st.lists(st.integers(-1, 7).map(float), min_size=1, max_size=10),
)
def test_history_percentile_matches_scipy_rank_definition(history: list[float], queries: list[float]) -> None:
    h = LossHistory(size=64, beta=2.0)
    h.push(torch.tensor(history))
    got = h.percentile(torch.tensor(queries)).tolist()
    want = [brute_percentile(history, q) for q in queries]
    assert got == pytest.approx(want, abs=1e-6)
    assert h.probabilities(torch.tensor(queries)).tolist() == pytest.approx([w**2 for w in want], abs=1e-6)


def test_history_ring_buffer_forgets_the_oldest() -> None:
    h = LossHistory(size=4, beta=1.0)
    h.push(torch.tensor([1.0, 2.0, 3.0]))
    h.push(torch.tensor([10.0, 11.0, float("inf")]))  # inf is not remembered
    assert sorted(x for x in h.values.tolist() if x == x) == [3.0, 10.0, 11.0]
    assert h.percentile(torch.tensor([float("nan")])).tolist() == [1.0]


def test_history_rule_selects_with_probability_cdf_pow_beta() -> None:
    beta, copies = 3.0, 3000
    h = LossHistory(size=400_000, beta=beta)
    h.push(torch.rand(400_000, generator=torch.Generator().manual_seed(0)))
    queries = torch.tensor([0.3, 0.6, 0.8, 0.95])
    batch = queries.repeat_interleave(copies)  # one Bernoulli per example: many examples per query
    mask = h.sample(batch, torch.Generator().manual_seed(1), at_least_one=False)
    freq = mask.view(4, copies).float().mean(1)
    p = h.probabilities(queries)  # the history now holds the batch too, as when it was drawn
    sd = (p * (1 - p) / copies).sqrt()
    assert ((freq - p).abs() / sd).max() < 4.5, (freq, p)
    assert torch.allclose(p, queries**beta, atol=0.03)  # ~uniform history (3% are the queries)
    assert ((freq - queries ** (beta / 2)).abs() / sd).max() > 10  # a wrong exponent would be caught


def test_history_rule_iterate_yields_full_batches_of_about_one_in_beta_plus_one() -> None:
    n_batches, bs = 150, 64
    gen = torch.Generator().manual_seed(123)
    data = [(torch.rand(bs, 1, generator=gen), torch.zeros(bs)) for _ in range(n_batches)]

    def loss_of_value(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return out[:, 0]  # iid uniform losses: the history rule keeps E[U ** 3] = 1 / 4

    sb = SelectiveBackprop(start=0.0, end=1.0, scale_factor=1.0, interrupt=0, rule="history", beta=3.0)
    out = list(sb.iterate(data, nn.Identity(), loss_of_value, epoch=0, num_epochs=1))
    sizes = [len(y) for _, y in out]
    assert all(s == bs for s in sizes[:-1]) and 0 < sizes[-1] <= bs
    frac = sum(sizes) / (n_batches * bs)
    assert abs(frac - 0.25) < 0.02, frac
    assert sb.stats.backpropagated == sum(sizes) and sb.stats.skipped == n_batches * bs - sum(sizes)


@pytest.mark.parametrize("rule", ["rank", "history"])
def test_state_dict_round_trip_resumes_the_same_draws(rule: str) -> None:
    model = nn.Linear(4, 3)
    gen = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(16, 4, generator=gen), torch.randint(0, 3, (16,), generator=gen)) for _ in range(12)
    ]

    def run(sb: SelectiveBackprop, steps: range) -> list[torch.Tensor]:
        out = []
        for t in steps:
            positions = sb.select(batches[t], model, F.cross_entropy, progress=0.6, batch_idx=t).positions
            assert positions is not None
            out.append(positions)
        return out

    def make() -> SelectiveBackprop:
        return SelectiveBackprop(scale_factor=1.0, interrupt=0, rule=rule, seed=5)

    a = make()
    run(a, range(4))
    state = torch.load(_saved(a.state_dict()), weights_only=True)
    rest = run(a, range(4, 12))
    b = make()
    b.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(run(b, range(4, 12)), rest, strict=True))
    assert b.state_dict()["draws"] == 12 and b.stats.selected_batches == 12
    # a state saved before per-draw seeding (generator states, no draw count): one draw per selected batch
    legacy = {**{k: v for k, v in state.items() if k != "draws"}, "generators": {"cpu": torch.zeros(8)}}
    c = make()
    c.load_state_dict(legacy)
    assert c.state_dict()["draws"] == 4
    # power: an object that did not load the state draws differently on these batches
    fresh = run(make(), range(4, 12))
    assert sum(not torch.equal(p, q) for p, q in zip(fresh, rest, strict=True)) >= 6


def _saved(state: dict) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


# ---------------------------------------------------------------------------- Stale-SB
class CountingModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.lin(x)


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


def test_statistics_count_forwarded_backpropagated_skipped_and_time() -> None:
    model = nn.Linear(4, 3)
    batch = (torch.randn(10, 4), torch.randint(0, 3, (10,)))
    sb = SelectiveBackprop(start=0.5, end=0.9, keep=0.3, scale_factor=1.0, interrupt=2, timing=True)
    for i, progress in enumerate([0.1, 0.6, 0.6, 0.95]):
        with sb.step_timer():
            sb.select(batch, model, F.cross_entropy, progress=progress, batch_idx=i)
    s = sb.stats  # batch 2 (progress 0.6, (2 + 1) % 2 != 0) is the only selected one: 3 of 10 kept
    assert (s.batches, s.selected_batches, s.examples) == (4, 1, 40)
    assert (s.forwarded, s.reused, s.backpropagated, s.skipped) == (10, 0, 33, 7)
    assert s.backprop_fraction == 33 / 40 and s.forward_fraction == 10 / 40
    assert s.selection_time_s > 0 and s.step_time_s >= s.selection_time_s
    assert s.selection_overhead is not None and set(s.as_dict()) >= {"forwarded", "selection_overhead"}
