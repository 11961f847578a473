"""Controls (each choosing method beside its uniform twin) and the two methods of issue 16,
``obs-epoch`` and ``rho-loss``: the twins' library objects, the rows ``--controls`` adds, the
``controls`` section, and tiny end-to-end runs on scikit-learn digits (seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_cli import TINY, _restore_torch_globals, _run  # noqa: F401  (the fixture restores torch's globals)

from leanbatch.bench.config import TrainConfig
from leanbatch.bench.controls import twin_row, with_controls
from leanbatch.bench.data import load_data
from leanbatch.bench.methods import MethodError, parse_methods
from leanbatch.bench.train import Trainer
from leanbatch.policies import InfoBatchPolicy, LossRankPolicy, RandomPolicy
from leanbatch.selection import OnlineBatchSelection, SelectiveBackprop


def _twin(text: str):  # type: ignore[no-untyped-def]
    twin = twin_row(parse_methods(text)[0])
    assert twin is not None, text
    return twin


def test_each_twin_is_its_methods_choice_made_uniformly() -> None:
    ib = _twin("infobatch[prune_ratio=0.3,delta=0.5]")
    assert (ib.label, ib.kind) == ("infobatch[prune_ratio=0.3,delta=0.5]~random", "random")
    assert ib.make_policy(8, 0) == RandomPolicy(0.3, 8, 0.5)
    for text in ("sb[keep=0.7,start=0.2,interrupt=3]", "sb-proxy[keep=0.7,start=0.2,end=0.9,interrupt=3]"):
        sel = _twin(text).probe_selector()
        assert isinstance(sel, SelectiveBackprop) and sel.rule == "uniform" and not sel.runs_model, text
        assert (sel.keep, sel.start, sel.end, sel.interrupt) == (0.7, 0.2, 0.9, 3), text
    rho = _twin("rho-loss[keep=0.3,end=0.8]")
    assert (rho.label, rho.kind, rho.settings) == (
        "rho-loss[keep=0.3,end=0.8]~uniform", "uniform", {"keep": 0.3, "start": 0.0, "end": 0.8, "interrupt": 0},
    )  # fmt: skip
    both = _twin("infobatch+sb[prune_ratio=0.4,keep=0.7]")
    assert both.kind == "infobatch+uniform" and both.make_policy(8, 0) == InfoBatchPolicy(0.4, 8, 0.875)
    sel = both.probe_selector()
    assert (sel.rule, sel.keep, sel.start, sel.end, sel.interrupt) == ("uniform", 0.7, 0.5, 0.9, 2)
    obs = _twin("obs[keep=0.7,pressure=50,final_pressure=5]")
    rule = obs.probe_selector().selection_rule
    assert isinstance(obs.probe_selector(), OnlineBatchSelection) and obs.label.endswith("~uniform")
    assert (rule.keep, rule.pressure, rule.final_pressure) == (0.7, 1.0, None)  # type: ignore[attr-defined]
    assert parse_methods("obs-epoch")[0].make_policy(8, 0) == LossRankPolicy(0.7, 8, 100.0, None, 1.0)
    epoch = _twin("obs-epoch[keep=0.6]")
    assert epoch.make_policy(8, 0) == LossRankPolicy(0.6, 8, 1.0, None, 1.0)
    for text in ("baseline", "random", "rs2", "uniform", "obs[pressure=1]", "obs-epoch[pressure=1]"):
        assert twin_row(parse_methods(text)[0]) is None, text  # none, or its own twin


def test_with_controls_puts_each_twin_after_its_method_and_reuses_an_equal_row() -> None:
    rows = with_controls(parse_methods("baseline,infobatch,sb,random,rs2,sb-proxy,rho-loss"))
    assert [r.label for r in rows] == [
        "baseline", "infobatch", "sb", "sb~uniform", "random", "rs2", "sb-proxy", "sb-proxy~uniform", "rho-loss",
    ]  # fmt: skip
    controls = {r.label: r.control for r in rows if r.control}
    # rho-loss's twin (keep 0.5 of every batch) is sb-proxy's: one row serves both
    assert controls == {
        "infobatch": "random", "sb": "sb~uniform", "sb-proxy": "sb-proxy~uniform", "rho-loss": "sb-proxy~uniform",
    }  # fmt: skip
    assert rows[1].config()["control"] == "random" and "control" not in rows[0].config()
    with pytest.raises(MethodError) as e:
        with_controls(parse_methods("baseline,rs2,obs[pressure=1]"))
    assert "none of baseline, rs2, obs[pressure=1] has a uniform twin" in str(e.value)
    assert "infobatch, sb, infobatch+sb, obs, sb-proxy, obs-epoch, rho-loss" in str(e.value)


@pytest.fixture(scope="module")
def controls_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict]:  # type: ignore[type-arg]
    """Two seeds of obs and sb, each beside its twin, and rs2 (none), with both baseline families."""
    import contextlib
    import io

    from leanbatch import cli

    out_dir = tmp_path_factory.mktemp("controls")
    buf = io.StringIO()
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(buf):
            code = cli.main(
                [
                    *TINY,
                    "--seeds",
                    "0,1",
                    "--methods",
                    "baseline,obs,sb,rs2",
                    "--controls",
                    "--budgets",
                    "0.5,1",
                ]
                + ["--batch-budgets", "0.5", "--no-plots", "--out", str(out_dir)]
            )
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    return code, buf.getvalue(), json.loads((out_dir / "results.json").read_text())


def test_controls_run_beside_their_methods_and_are_paired_by_seed(
    controls_run: tuple[int, str, dict],
) -> None:  # type: ignore[type-arg]
    code, out, payload = controls_run
    assert code == 0
    labels = [m["label"] for m in payload["config"]["methods"]]
    assert labels == [
        "baseline", "baseline[budget=0.5]", "baseline[batch=0.5]", "obs", "obs~uniform", "sb", "sb~uniform", "rs2",
    ]  # fmt: skip
    assert payload["config"]["controls"] is True
    rows = {r["method"]: r for r in payload["controls"]["rows"]}
    assert list(rows) == ["obs", "sb"]
    acc = {(r["method"], r["seed"]): r["final_test_acc"] for r in payload["runs"]}
    time = {(r["method"], r["seed"]): r["train_time_s"] for r in payload["runs"]}
    for method, row in rows.items():
        twin = f"{method}~uniform"
        assert row["control"] == twin and row["seeds"] == [0, 1]
        diffs = [acc[method, s] - acc[twin, s] for s in (0, 1)]
        assert [p["diff"] for p in row["per_seed"]] == pytest.approx(diffs)
        assert row["diff_mean"] == pytest.approx(sum(diffs) / 2)
        assert row["control_train_time_s_mean"] == pytest.approx((time[twin, 0] + time[twin, 1]) / 2)
        assert row["ci_low"] <= row["diff_mean"] <= row["ci_high"] and row["verdict"] in (
            "above",
            "on",
            "below",
        )
    summary = {r["method"]: r for r in payload["summary"]}
    assert summary["obs"]["control"] == "obs~uniform" and summary["rs2"]["control"] is None
    twin_runs = [r for r in payload["runs"] if r["method"] == "sb~uniform"]
    assert all(r["forward_fraction"] == r["backward_fraction"] < 1 for r in twin_runs)  # no selection pass
    lines = [ln for ln in out.splitlines() if ln.startswith("| obs ") or ln.startswith("| sb ")]
    assert any("obs~uniform" in ln for ln in lines) and "vs twin" in out


def test_results_json_keeps_its_keys_and_gains_the_new_ones(controls_run: tuple[int, str, dict]) -> None:  # type: ignore[type-arg]
    payload = controls_run[2]
    old = {"schema", "command", "interrupted", "config", "versions", "data", "tolerance_points", "summary"}
    assert set(payload) >= old | {
        "equal_time",
        "equal_time_cpu",
        "runs",
        "envelope",
        "envelope_cpu",
        "controls",
    }
    assert payload["schema"] == "leanbatch.bench/2"
    assert set(payload["config"]) >= {"budgets", "batch_budgets", "lr_rule", "controls", "clock", "methods"}
    assert payload["config"]["budgets"] == [0.5, 1.0] and payload["config"]["batch_budgets"] == [0.5]
    for section in ("envelope", "envelope_cpu"):
        env = payload[section]
        assert set(env) >= {"clock", "rule", "confidence", "budgets", "batch_budgets", "families", "rows"}
        assert list(env["families"]) == ["steps", "batch"]
        assert [r["method"] for r in env["rows"]] == ["obs", "obs~uniform", "sb", "sb~uniform", "rs2"]
        for row in env["rows"]:
            assert set(row) >= set(payload["equal_time"]["rows"][0])  # the shape of equal_time
            assert all("family" in s for s in row["per_seed"])
    assert [r["method"] for r in payload["equal_time"]["rows"]][0] == "baseline[batch=0.5]"
    run = payload["runs"][0]
    assert {"batch", "setup", "budget", "steps", "epochs"} <= set(run)
    assert set(payload["summary"][0]) >= {"batch", "control", "budget", "acc_mean", "work_fraction"}


def test_controls_for_methods_without_a_twin_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run([*TINY, "--methods", "baseline,rs2", "--controls", "--out", str(tmp_path)], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert "--controls: none of baseline, rs2 has a uniform twin" in err and "obs-epoch, rho-loss" in err


# ---------------------------------------------------------------------------- obs-epoch and rho-loss
def test_rho_loss_charges_its_holdout_model_to_the_run() -> None:
    data = load_data("digits", 320, 60)
    cfg = TrainConfig(epochs=2, batch_size=32, widths=(8,))
    t = Trainer(data, parse_methods("rho-loss[il_epochs=1]")[0], 0, cfg)
    setup = t.select.setup  # type: ignore[union-attr]
    assert setup is not None and setup["time_s"] > 0 and setup["cpu_time_s"] > 0
    assert t.train_time == setup["time_s"] and t.train_cpu == setup["cpu_time_s"]  # before any epoch
    first = t.run_epoch()
    torch.set_flush_denormal(False)
    assert first.train_time > setup["time_s"]  # the epoch's clock starts from the holdout model's
    assert setup["holdout"] == 32 and setup["backpropagated"] == 32 and setup["forwarded"] == 32 + 320
    assert 0 < setup["cost"] < 1  # half the width here (4 of 8 channels, at least 4): fewer FLOPs


def test_obs_epoch_and_rho_loss_run_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    methods = "baseline,obs-epoch,rho-loss[il_epochs=2]"
    code, out, err = _run([*TINY, "--methods", methods, "--out", str(tmp_path), "--no-plots"], capsys)
    assert code == 0, err
    payload = json.loads((tmp_path / "results.json").read_text())
    runs = {r["method"]: r for r in payload["runs"]}
    epoch = runs["obs-epoch"]
    assert [e["loaded"] for e in epoch["epochs"]] == [224] * 3  # int(0.7 x 320) each epoch
    assert [e["steps"] for e in epoch["epochs"]] == [7] * 3  # full batches of 32: a shorter run
    assert epoch["setup"] is None and epoch["backward_fraction"] == pytest.approx(0.7)
    rho = runs["rho-loss[il_epochs=2]"]
    setup = rho["setup"]
    assert setup["holdout"] == 32 and setup["forwarded"] == 2 * 32 + 320 and setup["backpropagated"] == 64
    assert rho["epochs"][0]["train_time"] > setup["time_s"] > 0
    trained = sum(e["backpropagated"] for e in rho["epochs"])
    assert trained == 3 * 160  # half of each batch, every batch
    full = 3 * 320
    work = (trained + 3 * 320 + 2 * trained + (setup["forwarded"] + 2 * 64) * setup["cost"]) / (3 * full)
    assert rho["work_fraction"] == pytest.approx(work)  # the selection forward at full size, the IL model
    assert rho["backward_fraction"] == pytest.approx((trained + 64) / full)
    assert all(r["final_test_acc"] > 25.0 for r in runs.values())  # every row learned (chance: 10%)
