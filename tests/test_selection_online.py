"""Online batch selection (leanbatch.selection.online): its own name, memory and errors, the same draws as
its ``SelectiveBackprop(rule="loss_rank")`` alias, no model and no forward pass."""

from __future__ import annotations

import collections
import io
import sys

import pytest
import torch
import torch.nn as nn

import leanbatch
from leanbatch import OnlineBatchSelection, ScoreTable, SelectiveBackprop

N, B = 200, 16


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("online batch selection must not run the model")


def batches(steps: int = 20) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        idx = torch.randperm(N, generator=g)[:B]
        out.append((torch.randn(B, 3, generator=g), torch.rand(B, generator=g), idx))
    return out


def run(sel, data, with_model: bool = False, start: int = 0) -> list[torch.Tensor | None]:  # type: ignore[no-untyped-def]
    kept = []
    for t, (x, trained_loss, idx) in enumerate(data):
        progress = (start + t) / 40
        if with_model:  # the SelectiveBackprop alias, called as SelectiveBackprop is
            sel_out = sel.select((x, idx), Boom(), progress=progress, batch_idx=t, indices=idx)
        else:
            sel_out = sel.select((x, idx), progress=progress, batch_idx=t, indices=idx)
        kept.append(sel_out.positions)
        rows = torch.arange(B) if sel_out.positions is None else sel_out.positions
        sel.record_losses(idx[rows], trained_loss[rows])
    return kept


def test_draws_equal_the_loss_rank_alias_and_run_no_forward() -> None:
    data = batches()
    obs = OnlineBatchSelection(N, keep=0.3, pressure=50.0, final_pressure=2.0, interrupt=3, seed=7)
    alias = SelectiveBackprop(start=0.0, end=1.0, keep=0.3, interrupt=3, rule="loss_rank", num_samples=N,
                              selection_pressure=50.0, final_pressure=2.0, seed=7)  # fmt: skip
    a, b = run(obs, data), run(alias, data, with_model=True)
    assert all((p is None and q is None) or torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert sum(p is not None for p in a) == 14  # every third batch trains in full
    assert (
        obs.stats.forwarded == 0 and obs.stats.reused == 14 * B and obs.stats.backpropagated == 6 * B + 14 * 4
    )
    assert obs.stats == alias.stats and torch.equal(
        obs.score_table.values.nan_to_num(-1.0), alias.score_table.values.nan_to_num(-1.0)
    )
    # power: another seed draws other rows
    other = run(
        OnlineBatchSelection(N, keep=0.3, pressure=50.0, final_pressure=2.0, interrupt=3, seed=8), data
    )
    assert sum(p is not None and not torch.equal(p, q) for p, q in zip(a, other, strict=True)) >= 10


def test_forgetting_indices_names_online_batch_selection_not_stale_sb() -> None:
    obs = OnlineBatchSelection(N)
    x = torch.randn(B, 3)
    with pytest.raises(ValueError, match="OnlineBatchSelection ranks rows by the last trained loss") as err:
        obs.select((x,), progress=0.5, batch_idx=0)  # long before training ends: on every batch
    assert "Stale-SB" not in str(err.value) and "indices=" in str(err.value)
    alias = SelectiveBackprop(rule="loss_rank", num_samples=N)
    with pytest.raises(ValueError, match=r"SelectiveBackprop\(rule='loss_rank'\)") as err:
        alias.select((x, torch.zeros(B)), Boom(), progress=0.0, batch_idx=0)
    assert "Stale-SB" not in str(err.value) and "epoch" not in str(err.value)
    with pytest.raises(ValueError, match=r"indices must be a tensor of shape \(16,\)"):
        obs.select((x,), progress=0.5, batch_idx=0, indices=torch.arange(B + 1))
    with pytest.raises(ValueError, match="num_samples"):
        OnlineBatchSelection()


@pytest.mark.parametrize(
    "unused", ["scale_factor", "staleness", "scorer", "beta", "loss_fn", "rule", "selection_pressure"]
)
def test_takes_only_its_own_arguments(unused: str) -> None:
    with pytest.raises(TypeError, match=unused):
        OnlineBatchSelection(N, **{unused: 0.5})


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(keep=0.0), "keep"),
        (dict(pressure=0.5), "pressure"),
        (dict(start=0.9, end=0.5), "start"),
        (dict(interrupt=-1), "interrupt"),
        (dict(seed=1.5), "seed"),
        (dict(rank=-1), "rank"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises((TypeError, ValueError), match=name):
        OnlineBatchSelection(N, **kwargs)


def test_memory_holds_last_losses_without_epoch_stamps_and_resumes() -> None:
    data = batches()
    a = OnlineBatchSelection(N, keep=0.5, seed=3)
    run(a, data[:10])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert set(state["memory"]) == {"table"} and state["history"] is None and state["draws"] == 10
    rest = run(a, data[10:], start=10)
    b = OnlineBatchSelection(N, keep=0.5, seed=3)
    b.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(run(b, data[10:], start=10), rest, strict=True))
    fresh = run(OnlineBatchSelection(N, keep=0.5, seed=3), data[10:], start=10)  # power: no memory, no draws
    assert sum(not torch.equal(p, q) for p, q in zip(fresh, rest, strict=True)) >= 5


def test_any_batch_structure_and_a_shared_infobatch_table() -> None:
    table = ScoreTable(N)
    obs = leanbatch.OnlineBatchSelection(score_table=table, keep=0.25, pressure=1e9, seed=0)
    idx = torch.arange(8)
    table.update(idx, torch.tensor([0.1, 0.2, 5.0, 0.3, 4.0, 0.4, 0.0, 0.0]))  # InfoBatch's update, say
    batch = {"input_ids": torch.zeros(8, 5, dtype=torch.long), "index": idx, "source": "toy"}  # no labels
    sel = obs.select(batch, progress=0.5, batch_idx=0, indices=idx)
    assert (
        sel.positions.tolist() == [2, 4]
        and sel.batch["index"].tolist() == [2, 4]
        and sel.batch["source"] == "toy"
    )
    assert obs.score_table is table and obs.is_active(0.99, 5) and not obs.is_active(1.0, 0)


# ---------------------------------------------------------------------------- checks once per shape
CHECKS = ("check_pressure", "pressure_at", "check_fraction", "check_real", "check_int", "num_selected")


def checks_per_step(
    sel, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """For each step, how often selection's argument checks ran (``sys.setprofile``), by name;
    ``check_per_sample_loss`` only when selection itself called it (the table's writes check theirs)."""
    model, out = nn.Linear(3, 2), []

    def profile(frame, event, arg) -> None:  # type: ignore[no-untyped-def]
        name, caller = frame.f_code.co_name, frame.f_back.f_globals.get("__name__", "")
        if event == "call" and frame.f_globals.get("__name__", "").startswith("leanbatch"):
            if name in CHECKS or (name == "check_per_sample_loss" and caller.startswith("leanbatch.sel")):
                out[-1][name] += 1

    for t, (x, y, idx) in enumerate(steps):
        out.append(collections.Counter())
        sys.setprofile(profile)
        try:
            s = sel.select((x, y), model, nn.functional.cross_entropy, progress=0.5, batch_idx=t, indices=idx)
            if sel.score_table is not None and not sel.runs_model:
                sel.record_losses(idx[s.positions], torch.rand(s.positions.shape[0]))
        finally:
            sys.setprofile(None)
    return out


@pytest.mark.parametrize("method", ["online", "selective_backprop", "rho_loss"])
def test_a_selection_step_checks_its_arguments_once_per_batch_shape_not_every_step(method: str) -> None:
    g = torch.Generator().manual_seed(0)
    sizes = [16, 16, 16, 16, 8, 8, 8, 16]  # two shapes: the scores are checked when the shape changes
    steps = [
        (
            torch.randn(b, 3, generator=g),
            torch.randint(0, 2, (b,), generator=g),
            torch.randperm(N, generator=g)[:b],
        )
        for b in sizes
    ]
    sel = {
        "online": lambda: OnlineBatchSelection(N, keep=0.5, pressure=100.0, final_pressure=2.0, seed=0),
        "selective_backprop": lambda: SelectiveBackprop(
            start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0
        ),
        "rho_loss": lambda: leanbatch.selection.RhoLoss(torch.zeros(N), keep=0.5),
    }[method]()
    counts = checks_per_step(sel, steps)
    assert all(sum(c.get(name, 0) for name in CHECKS) == 0 for c in counts), counts  # checked when built
    scores_checked = [c.get("check_per_sample_loss", 0) for c in counts]
    assert scores_checked == [1, 0, 0, 0, 1, 0, 0, 1], counts  # once per new shape, not per step
    # the checks still hold: a bad step argument and bad scores of a new shape raise as ever
    with pytest.raises(ValueError, match=r"progress must be a finite number in \[0, 1\], got 1.5"):
        sel.select(steps[0][:2], nn.Linear(3, 2), progress=1.5, batch_idx=0, indices=steps[0][2])
    with pytest.raises(TypeError, match="got torch.bool: a bool or complex tensor cannot be ranked"):
        sel.selection_rule.positions(
            torch.zeros(4, dtype=torch.bool), leanbatch.selection.rules.Draw(4, torch.device("cpu"))
        )
