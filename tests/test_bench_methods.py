"""The new methods in ``leanbatch bench``: parsing, validation, the policy each row builds, and a
tiny end-to-end run of every one of them (scikit-learn digits, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import TINY, _restore_torch_globals, _run  # noqa: F401  (the fixture restores torch's globals)

from leanbatch.bench.methods import DEFAULT_METHODS, KINDS, MethodError, parse_methods
from leanbatch.policies import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    LossRankPolicy,
    RandomPolicy,
    RS2Policy,
    SeTaPolicy,
    UCBPolicy,
)

NEW_METHODS = ("rs2", "epsilon-greedy", "ucb", "seta", "obs", "sb-proxy")  # not in the default run
NEWER = ("obs-epoch", "rho-loss", "uniform", "infobatch+uniform")  # issue 16: two methods, two twins


def test_new_kinds_parse_with_their_papers_defaults_and_leave_the_default_run_alone() -> None:
    assert DEFAULT_METHODS == ("baseline", "random", "infobatch", "sb", "infobatch+sb")  # `--methods` default
    assert KINDS == DEFAULT_METHODS + NEW_METHODS + NEWER
    specs = {s.kind: s for s in parse_methods(",".join(NEW_METHODS))}
    assert specs["rs2"].settings == {"prune_ratio": 0.3}
    assert specs["ucb"].settings == {"prune_ratio": 0.3, "epsilon": 0.1, "ema": 0.9, "c": 1.0}
    assert specs["seta"].settings == {
        "prune_ratio": 0.1,
        "num_groups": 5,
        "window_scale": 0.9,
        "delta": 0.875,
    }
    assert specs["obs"].settings["pressure"] == 100.0
    assert specs["sb-proxy"].settings["width"] == 0.25
    assert all(specs[k].prunes and not specs[k].selects for k in ("rs2", "epsilon-greedy", "ucb", "seta"))
    assert all(specs[k].selects and not specs[k].prunes for k in ("obs", "sb-proxy"))
    kinds = {k: type(specs[k].make_policy(8, seed=0)) for k in ("rs2", "epsilon-greedy", "ucb", "seta")}
    assert kinds == {
        "rs2": RS2Policy,
        "epsilon-greedy": EpsilonGreedyPolicy,
        "ucb": UCBPolicy,
        "seta": SeTaPolicy,
    }


def test_infobatch_options_reach_the_policy() -> None:  # the old spellings; the library's names below
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
    [  # the library's messages, naming its arguments; the row as typed, and the old spelling's name
        ("rs2[prune_fraction=1.0]", "rs2[prune_fraction=1.0]: prune_ratio must be in [0, 1), got 1.0"),
        ("rs2[prune_fraction=1.0]", "(prune_fraction is prune_ratio)"),
        ("ucb[ucb_c=-1]", "c must be"),
        ("infobatch[ib_target=most]", "target must be 'below'"),
        ("obs[obs_pressure=0.5]", "pressure must be a finite number >= 1, got 0.5"),
        ("sb-proxy[sel_start=0.5,sel_end=0.5]", "start must be < end, got start=0.5, end=0.5"),
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


# ---------------------------------------------------------------------------- the registry
OLD_SPELLINGS = {  # the bracket spellings of earlier versions -> the library's names
    "sb_keep": "keep",
    "sb_start": "start",
    "sb_end": "end",
    "sb_scale": "scale_factor",
    "sb_interrupt": "interrupt",
    "sel_keep": "keep",
    "sel_start": "start",
    "sel_end": "end",
    "sel_interrupt": "interrupt",
    "prune_fraction": "prune_ratio",
    "seta_prune": "prune_ratio",
    "seta_groups": "num_groups",
    "seta_window": "window_scale",
    "score_ema": "ema",
    "ucb_c": "c",
    "ib_target": "target",
    "ib_warmup": "warmup_epochs",
    "ib_refresh": "refresh_every",
    "ib_max_weight": "max_weight",
    "obs_pressure": "pressure",
    "obs_final_pressure": "final_pressure",
    "proxy_width": "width",
    "proxy_keep": "train_keep",
    "proxy_every": "train_every",
}
VALUES = {  # a valid value other than the default, per setting
    "prune_ratio": "0.2", "delta": "0.5", "target": "all", "warmup_epochs": "1", "refresh_every": "3",
    "max_weight": "2", "keep": "0.7", "start": "0.1", "end": "0.8", "scale_factor": "0.25", "interrupt": "3",
    "epsilon": "0.2", "ema": "0.5", "c": "2", "num_groups": "4", "window_scale": "0.75", "pressure": "10",
    "final_pressure": "2", "width": "0.5", "train_keep": "0.25", "train_every": "2", "budget": "0.5",
    "stack_scores": "trained", "batch": "0.5", "holdout": "0.2", "il_width": "0.5", "il_epochs": "2",
}  # fmt: skip


def test_every_kind_is_registered_once_with_its_family_and_builds_library_objects() -> None:
    from leanbatch.bench.registry import FAMILIES, REGISTRY
    from leanbatch.selection import OnlineBatchSelection, RhoLoss, SelectiveBackprop

    assert tuple(REGISTRY) == KINDS and len(set(KINDS)) == len(KINDS)
    families = {k.name: k.family for k in REGISTRY.values()}
    assert families == {
        "baseline": "baseline", "random": "pruning", "infobatch": "pruning", "sb": "selecting",
        "infobatch+sb": "both", "rs2": "pruning", "epsilon-greedy": "pruning", "ucb": "pruning",
        "seta": "pruning", "obs": "selecting", "sb-proxy": "selecting", "obs-epoch": "pruning",
        "rho-loss": "selecting", "uniform": "selecting", "infobatch+uniform": "both",
    }  # fmt: skip
    for kind in REGISTRY.values():
        assert kind.family in FAMILIES and kind.description and "\n" not in kind.description
        assert kind.prunes == (kind.family in ("pruning", "both"))
        assert kind.selects == (kind.family in ("selecting", "both"))
        assert kind.twin is None or REGISTRY[kind.twin.kind].family == kind.family
    rows = {r.kind: r for r in parse_methods(",".join(KINDS))}
    policies = {k: type(r.make_policy(8, 0)) for k, r in rows.items() if r.prunes}
    assert policies == {
        "random": RandomPolicy, "infobatch": InfoBatchPolicy, "infobatch+sb": InfoBatchPolicy,
        "rs2": RS2Policy, "epsilon-greedy": EpsilonGreedyPolicy, "ucb": UCBPolicy, "seta": SeTaPolicy,
        "obs-epoch": LossRankPolicy, "infobatch+uniform": InfoBatchPolicy,
    }  # fmt: skip
    selectors = {k: type(r.probe_selector()) for k, r in rows.items() if r.selects}
    assert selectors == {
        "sb": SelectiveBackprop, "infobatch+sb": SelectiveBackprop, "obs": OnlineBatchSelection,
        "sb-proxy": SelectiveBackprop, "rho-loss": RhoLoss, "uniform": SelectiveBackprop,
        "infobatch+uniform": SelectiveBackprop,
    }  # fmt: skip
    assert rows["sb-proxy"].probe_selector().rule == "top" and rows["sb"].probe_selector().rule == "rank"
    assert REGISTRY["infobatch"].twin.kind == "random"  # type: ignore[union-attr]
    assert (
        rows["uniform"].probe_selector().rule == rows["infobatch+uniform"].probe_selector().rule == "uniform"
    )


def test_the_library_names_reach_the_library_objects() -> None:
    ib = parse_methods("infobatch[target=all,warmup_epochs=1,refresh_every=3,max_weight=1.5]")[0]
    assert ib.make_policy(10, 0) == InfoBatchPolicy(0.5, 10, 0.875, "all", 1, 3, 1.5)
    sb = parse_methods("sb[keep=0.7,start=0.1,end=0.8,scale_factor=0.25,interrupt=3]")[0].probe_selector()
    assert (sb.keep, sb.start, sb.end, sb.scale_factor, sb.interrupt) == (0.7, 0.1, 0.8, 0.25, 3)
    obs = parse_methods("obs[keep=0.7,pressure=10,final_pressure=2,start=0.1,end=0.8,interrupt=3]")[0]
    rule = obs.probe_selector().selection_rule
    assert (rule.keep, rule.pressure, rule.final_pressure) == (0.7, 10.0, 2.0)  # type: ignore[attr-defined]
    proxy = parse_methods("sb-proxy[train_keep=0.25,train_every=2]")[0].probe_selector()
    assert (proxy.scorer.train_keep, proxy.scorer.train_every) == (0.25, 2)  # type: ignore[union-attr]


def _aliased() -> list[tuple[str, str, str]]:
    from leanbatch.bench.registry import REGISTRY

    return [(k.name, a, s.name) for k in REGISTRY.values() for s in k.settings for a in s.aliases]


def test_the_old_spellings_are_the_registrys_aliases() -> None:
    assert {alias: name for _, alias, name in _aliased()} == OLD_SPELLINGS


@pytest.mark.parametrize(("kind", "alias", "name"), _aliased())
def test_an_old_spelling_parses_to_the_same_row_as_the_library_name(kind: str, alias: str, name: str) -> None:
    old = parse_methods(f"{kind}[{alias}={VALUES[name]}]")[0]
    new = parse_methods(f"{kind}[{name}={VALUES[name]}]")[0]
    assert old.label == f"{kind}[{alias}={VALUES[name]}]"  # the row keeps what was typed
    assert old.settings == new.settings != parse_methods(kind)[0].settings
    assert old.config()[alias] == new.config()[alias]  # results.json's key is the old spelling
    with pytest.raises(MethodError, match=f"{name} is set twice"):
        parse_methods(f"{kind}[{alias}={VALUES[name]},{name}={VALUES[name]}]")


def test_global_options_set_the_rows_that_carry_their_key_and_brackets_win() -> None:
    given = {"prune_ratio": 0.7, "delta": 0.5, "sb_keep": 0.3, "sb_scale": 0.25, "stack_scores": "trained"}
    rows = {r.kind: r.settings for r in parse_methods("infobatch,rs2,seta,sb,obs,infobatch+sb", given)}
    assert (rows["infobatch"]["prune_ratio"], rows["infobatch"]["delta"]) == (0.7, 0.5)
    assert rows["rs2"] == {"prune_ratio": 0.3}  # --prune-ratio is InfoBatch's (rs2's was prune_fraction)
    assert (rows["seta"]["prune_ratio"], rows["seta"]["delta"]) == (0.1, 0.5)  # --delta was seta's too
    assert (rows["sb"]["keep"], rows["sb"]["scale_factor"], rows["obs"]["keep"]) == (0.3, 0.25, 0.5)
    assert rows["infobatch+sb"]["stack_scores"] == "trained"
    assert parse_methods("infobatch[prune_ratio=0.2]", given)[0].settings["prune_ratio"] == 0.2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("sb[sel_keep=0.5]", "sel_keep applies to obs, sb-proxy only; sb's settings: keep=0.5 (sb_keep)"),
        (
            "rs2[delta=0.5]",
            "delta applies to random, infobatch, infobatch+sb, seta, obs-epoch, infobatch+uniform only",
        ),
        ("obs[pressure=100,nope=1]", "unknown setting 'nope'; obs's settings: keep=0.5 (sel_keep)"),
        ("obs[obs_pressure=inf]", "obs[obs_pressure=inf]': pressure must be a finite number, got inf"),
        ("sb[keep=nan]", "keep must be a finite number, got nan"),
        ("sb[interrupt=2.5]", "interrupt must be an integer, got '2.5'"),
        ("sb-proxy[proxy_width=0]", "width must be a finite number in (0, 1], got 0.0"),
        ("infobatch+sb[stack_scores=both]", "stack_scores must be one of 'selection', 'trained', got 'both'"),
    ],
)
def test_settings_of_another_kind_and_non_finite_values_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(MethodError) as e:
        parse_methods(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_number_setting_of_any_kind_takes_nan_or_inf(value: str) -> None:
    from leanbatch.bench.registry import REGISTRY

    for kind in REGISTRY.values():
        for s in kind.settings:
            if s.type in ("float", "optional", "int"):
                with pytest.raises(MethodError, match=f"{s.name} must be"):
                    parse_methods(f"{kind.name}[{s.name}={value}]")


def _commands() -> list[Path]:
    return sorted(Path(__file__).parent.parent.glob("benchmarks/results/*/results.json"))


@pytest.mark.parametrize("path", _commands(), ids=lambda p: p.parent.name)
def test_the_commands_of_existing_results_make_the_same_rows(path: Path) -> None:
    """Each results.json under benchmarks/results: its command parses to the same labels, and every
    row keeps every key (and value) its ``config.methods`` entry had, with the library's names beside."""
    import shlex

    from leanbatch.bench.presets import resolve
    from leanbatch.cli_args import build_parser
    from leanbatch.cli_bench import bench_rows

    payload = json.loads(path.read_text())
    command = payload["command"]  # a list in a report merged from parts: each part's command
    for line in command if isinstance(command, list) else [command]:
        args = build_parser().parse_args(shlex.split(line)[1:])
        options = ("data", "epochs", "seeds", "budgets", "batch_budgets", "model", "widths")
        opts = resolve("quick" if args.quick else args.preset, {k: getattr(args, k) for k in options})
        if "batch_budgets" not in payload["config"]:  # written before batch budgets existed
            opts["batch_budgets"] = "none"
        rows = bench_rows(args, opts)
        old = payload["config"]["methods"]
        assert [r.label for r in rows] == [m["label"] for m in old]
        for row, entry in zip(rows, old, strict=True):
            new = row.config()
            assert {k: new[k] for k in entry} == entry
            assert new["settings"] == dict(row.settings)


@pytest.mark.parametrize("path", _commands(), ids=lambda p: p.parent.name)
def test_the_report_reads_every_stored_result_and_recomputes_its_summary(path: Path) -> None:
    from leanbatch.bench.report import read_results, rebuild

    stored = json.loads(path.read_text())
    again = rebuild(read_results(path))
    keys = ("method", "acc_mean", "acc_std", "work_fraction", "forward_fraction", "backward_fraction")
    assert [{k: r[k] for k in keys} for r in again["summary"]] == [
        {k: r[k] for k in keys} for r in stored["summary"]
    ]
