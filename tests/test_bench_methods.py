"""The new methods in ``leanbatch bench``: parsing, validation, the policy each row builds, and a
tiny end-to-end run of every one of them (scikit-learn digits, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import TINY, _restore_torch_globals, _run  # noqa: F401  (the fixture restores torch's globals)

from leanbatch.bench.methods import KINDS, METHODS, NEW_METHODS, MethodError, parse_methods
from leanbatch.policies import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    RandomPolicy,
    RS2Policy,
    SeTaPolicy,
    UCBPolicy,
)


def test_new_kinds_parse_with_their_papers_defaults_and_leave_the_default_run_alone() -> None:
    assert METHODS == ("baseline", "random", "infobatch", "sb", "infobatch+sb")  # `--methods` default
    assert set(NEW_METHODS) <= set(KINDS)
    specs = {s.kind: s for s in parse_methods(",".join(NEW_METHODS))}
    assert specs["rs2"].hyperparameters() == {"prune_fraction": 0.3}
    assert specs["ucb"].hyperparameters() == {
        "prune_fraction": 0.3,
        "epsilon": 0.1,
        "score_ema": 0.9,
        "ucb_c": 1.0,
    }
    assert specs["seta"].hyperparameters() == {
        "seta_prune": 0.1,
        "seta_groups": 5,
        "seta_window": 0.9,
        "delta": 0.875,
    }
    assert specs["obs"].hyperparameters()["obs_pressure"] == 100.0
    assert specs["sb-proxy"].hyperparameters()["proxy_width"] == 0.25
    assert all(specs[k].prunes and not specs[k].selects for k in ("rs2", "epsilon-greedy", "ucb", "seta"))
    assert all(specs[k].selects and not specs[k].prunes for k in ("obs", "sb-proxy"))
    kinds = {k: type(specs[k].make_policy(8, seed=0)) for k in ("rs2", "epsilon-greedy", "ucb", "seta")}
    assert kinds == {
        "rs2": RS2Policy,
        "epsilon-greedy": EpsilonGreedyPolicy,
        "ucb": UCBPolicy,
        "seta": SeTaPolicy,
    }


def test_infobatch_options_reach_the_policy() -> None:
    (ib, rnd) = parse_methods(
        "infobatch[ib_target=all,ib_warmup=1,ib_refresh=3,ib_max_weight=1.5],random[ib_target=all]"
    )
    pol = ib.make_policy(10, seed=0)
    assert isinstance(pol, InfoBatchPolicy) and (pol.target, pol.warmup_epochs, pol.refresh_every) == (
        "all",
        1,
        3,
    )
    assert pol.max_weight == 1.5
    assert isinstance(rnd.make_policy(10, 0), RandomPolicy) and rnd.make_policy(10, 0).max_weight is None
    default = parse_methods("infobatch")[0].make_policy(10, 0)
    assert default == InfoBatchPolicy(0.5, 10, 0.875)  # the paper's semantics, every option off


@pytest.mark.parametrize(
    "text,needle",
    [
        ("rs2[prune_fraction=1.0]", "prune_fraction=1.0"),
        ("ucb[ucb_c=-1]", "ucb_c=-1"),
        ("infobatch[ib_target=most]", "ib_target='most'"),
        ("obs[obs_pressure=0.5]", "obs_pressure=0.5"),
        ("sb-proxy[sel_start=0.5,sel_end=0.5]", "sel_start=0.5 >= sel_end=0.5"),
        ("seta[seta_groups=5,seta_window=0.05]", "window_scale"),
        ("fastest", "rs2, epsilon-greedy, ucb, seta, obs, sb-proxy"),
    ],
)
def test_bad_settings_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(MethodError) as e:
        parse_methods(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_every_new_method_runs_in_the_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    methods = "baseline,infobatch[ib_target=all,prune_ratio=0.3],rs2,epsilon-greedy,ucb,seta,obs,sb-proxy"
    code, out, err = _run([*TINY, "--methods", methods, "--out", str(tmp_path), "--no-plots"], capsys)
    assert code == 0, err
    summary = {r["method"]: r for r in json.loads((tmp_path / "results.json").read_text())["summary"]}
    assert list(summary) == [m.label for m in parse_methods(methods)]
    for name in ("infobatch[ib_target=all,prune_ratio=0.3]", "rs2", "epsilon-greedy", "ucb", "seta"):
        assert summary[name]["forward_fraction"] < 0.95, name  # pruned epochs load fewer samples
    rs2 = summary["rs2"]
    assert abs(rs2["forward_fraction"] - 0.7) < 0.01  # the exact budget every epoch (no annealing)
    for name in ("obs", "sb-proxy"):
        assert 0.45 < summary[name]["backward_fraction"] < 0.55, name  # half of every batch
    assert summary["obs"]["forward_fraction"] == summary["obs"]["backward_fraction"]  # no selection pass
    assert summary["sb-proxy"]["forward_fraction"] > 1.4  # the proxy scores every example
    assert all(r["acc_mean"] > 25.0 for r in summary.values())  # every row learned (chance: 10%)
