"""SelectiveBackprop and the composed selector (leanbatch.selection.selective_backprop, selector):
arguments, first-call checks, the sync-free step, state, statistics."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from selection_helpers import (
    cnn,
    forbid_host_reads,
    saved,
)

from leanbatch import SelectiveBackprop, select_using_loss
from leanbatch.selection import (
    ForwardScores,
    RankRule,
    ScorerScores,
    Selector,
    StaleScores,
    UniformRule,
    Window,
)


def test_per_step_path_makes_no_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU stand-in for torch.cuda.set_sync_debug_mode('error'): every Python-level read of a
    tensor value (item, tolist, bool(), nonzero, boolean-mask indexing) raises inside selection."""
    model = cnn().train()
    X, y = torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,))
    sb = SelectiveBackprop(interrupt=0, loss_fn=F.cross_entropy)
    sb.check((X, y), model)  # one-off, not per step
    forbid_host_reads(monkeypatch, masks=True)
    X_new, _ = select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
    sel = sb.select((X, y), model, progress=0.7, batch_idx=0)
    # Composer's inputs too: a dict X given whole to the model, an integer loss
    X_dict, y_dict = select_using_loss(
        {"x": X, "tag": "t"}, y, lambda d: model(d["x"]), lambda o, t, reduction="none": t, keep=0.5
    )
    monkeypatch.undo()
    assert X_new.shape[0] == 16 and sel.batch[0].shape[0] == 16
    assert X_dict["x"].shape[0] == 16 and X_dict["tag"] == "t" and y_dict.shape == (16,)


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
    state = torch.load(saved(a.state_dict()), weights_only=True)
    rest = run(a, range(4, 12))
    b = make()
    b.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(run(b, range(4, 12)), rest, strict=True))
    assert b.state_dict()["draws"] == 12 and b.stats.selected_batches == 12
    # a state of a pre-release format (generator states, no draw count; "stale" for "memory"): one error
    legacy = {**{k: v for k, v in state.items() if k != "draws"}, "generators": {"cpu": torch.zeros(8)}}
    renamed = {**{k: v for k, v in state.items() if k != "memory"}, "stale": None}
    for old, key in ((legacy, "draws"), (renamed, "memory")):
        with pytest.raises(ValueError, match=f"SelectiveBackprop state_dict has no key '{key}'"):
            make().load_state_dict(old)
    # power: an object that did not load the state draws differently on these batches
    fresh = run(make(), range(4, 12))
    assert sum(not torch.equal(p, q) for p, q in zip(fresh, rest, strict=True)) >= 6


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


# ---------------------------------------------------------------------------- the uniform twin, the parts
def test_uniform_rule_is_the_twin_with_no_selection_pass() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("the uniform rule must not run the model")

    x, y = torch.randn(10, 1, 8, 8), torch.arange(10)
    twin = SelectiveBackprop(start=0.5, end=0.9, keep=0.3, interrupt=2, rule="uniform", seed=4)
    assert twin.rule == "uniform" and not twin.runs_model and twin.scale_factor == 1.0
    out = [
        twin.select((x, y), Boom(), progress=0.6, batch_idx=i) for i in range(8)
    ]  # no loss function needed
    kept = [o.positions for o in out[::2]]
    assert all(o.positions is None and o.losses is None for o in out[1::2])  # interrupt batches train in full
    assert all(p.shape == (3,) and o.losses is None for p, o in zip(kept, out[::2], strict=True))
    assert all(torch.equal(o.batch[1], p) for o, p in zip(out[::2], kept, strict=True))  # y holds the row ids
    st = twin.stats
    assert (st.forwarded, st.reused, st.selected_batches, st.backpropagated, st.skipped) == (
        0,
        0,
        4,
        4 * 3 + 4 * 10,
        28,
    )
    again = SelectiveBackprop(start=0.5, end=0.9, keep=0.3, interrupt=2, rule="uniform", seed=4)
    assert all(
        torch.equal(again.select((x, y), None, progress=0.6, batch_idx=i).positions, p)
        for i, p in zip((0, 2, 4, 6), kept, strict=True)
    )
    assert len({tuple(p.tolist()) for p in kept}) > 1  # each draw is its own
    assert not SelectiveBackprop(keep=1.0, rule="uniform").is_active(0.6, 0)
    for kwargs in (dict(staleness=2), dict(scorer=lambda x, y: x), dict(num_samples=10)):
        with pytest.raises(ValueError, match="uniform"):
            SelectiveBackprop(rule="uniform", **kwargs)


def test_arguments_a_rule_does_not_use_are_not_validated_and_attributes_read_the_parts() -> None:
    obs = SelectiveBackprop(rule="loss_rank", num_samples=10, scale_factor=0.0, loss_fn="unused", beta=-1.0)
    assert obs.scale_factor == 1.0 and obs.keep == 0.5 and obs.staleness == 1 and obs.scorer is None
    history = SelectiveBackprop(rule="history", keep=0.0, selection_pressure=float("inf"))
    assert history.keep is None and history.history is not None and history.scale_factor == 0.5
    scorer = lambda x, y: x.sum(1)  # noqa: E731
    stale = SelectiveBackprop(
        staleness=3, num_samples=10, scorer=scorer, scale_factor=0.0, input_key="x", target_key="y"
    )
    assert (
        stale.staleness == 3 and stale.scorer is scorer and stale.scale_factor == 1.0 and not stale.runs_model
    )
    assert (stale.input_key, stale.target_key, stale.start, stale.end, stale.interrupt) == (
        "x",
        "y",
        0.5,
        0.9,
        2,
    )
    assert isinstance(stale.source, StaleScores) and isinstance(stale.source.source, ScorerScores)


def test_selective_backprop_is_its_parts_composed() -> None:
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(12, 4, generator=gen), torch.randint(0, 3, (12,), generator=gen)) for _ in range(6)]
    model = nn.Linear(4, 3)
    sb = SelectiveBackprop(
        start=0.2, end=0.8, keep=0.4, scale_factor=1.0, interrupt=3, seed=2, loss_fn=F.cross_entropy
    )
    composed = Selector(Window(0.2, 0.8, 3), ForwardScores(1.0, F.cross_entropy), RankRule(0.4), seed=2)
    for i, batch in enumerate(data):
        a, b = (
            sb.select(batch, model, progress=0.5, batch_idx=i),
            composed.select(batch, model, progress=0.5, batch_idx=i),
        )
        assert (a.positions is None and b.positions is None) or torch.equal(a.positions, b.positions)
    assert (
        sb.stats == composed.stats and sb.state_dict()["draws"] == composed.state_dict()["draws"] == 4
    )  # two interrupt batches
    with pytest.raises(ValueError, match="needs a source"):
        Selector(Window(), None, RankRule(0.5))
    with pytest.raises(ValueError, match="reads no scores"):
        Selector(Window(), ForwardScores(), UniformRule(0.5))
