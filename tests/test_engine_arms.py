"""The arms of a study: every method registered once and built from its settings (the library's
names), ``--methods`` parsed into arms with one-line errors, the twins of ``--controls``, the
baseline's budgets, and their arithmetic (steps, rows, epochs, what each epoch serves)."""

from __future__ import annotations

import pytest

from leanbatch import (
    EpsilonGreedyPolicy,
    InfoBatchPolicy,
    LossRankPolicy,
    OnlineBatchSelection,
    RandomPolicy,
    RS2Policy,
    SelectiveBackprop,
    SeTaPolicy,
    UCBPolicy,
)
from leanbatch.arms.methods import (
    DEFAULT_METHODS,
    ArmError,
    option_setting,
    parse_budgets,
    parse_methods,
    with_budgets,
)
from leanbatch.arms.registry import REGISTRY
from leanbatch.arms.twins import twin_arm, with_controls
from leanbatch.engine.running.data import Budget
from leanbatch.selection import RhoLoss

KINDS = (
    "baseline", "random", "infobatch", "sb", "infobatch+sb", "rs2", "epsilon-greedy", "ucb", "seta", "obs",
    "sb-proxy", "obs-epoch", "rho-loss", "uniform", "infobatch+uniform", "token-selection",
)  # fmt: skip


def test_every_kind_is_registered_once_with_its_family_and_builds_library_objects() -> None:
    assert tuple(REGISTRY) == KINDS and DEFAULT_METHODS == (
        "baseline",
        "random",
        "infobatch",
        "sb",
        "infobatch+sb",
    )
    for kind in REGISTRY.values():
        assert kind.description and "\n" not in kind.description
        assert (kind.policy is not None) == (kind.family in ("pruning", "both")) and (
            kind.selector is not None
        ) == (kind.family in ("selecting", "both"))
        assert kind.twin is None or REGISTRY[kind.twin.kind].family == kind.family
    arms = {a.kind: a for a in parse_methods(",".join(KINDS))}
    policies = {k: type(a.policy(8, 0)) for k, a in arms.items() if a.prunes}
    assert policies == {
        "random": RandomPolicy, "infobatch": InfoBatchPolicy, "infobatch+sb": InfoBatchPolicy, "rs2": RS2Policy,
        "epsilon-greedy": EpsilonGreedyPolicy, "ucb": UCBPolicy, "seta": SeTaPolicy, "obs-epoch": LossRankPolicy,
        "infobatch+uniform": InfoBatchPolicy,
    }  # fmt: skip
    selectors = {k: type(a.probe_selector()) for k, a in arms.items() if a.selects}
    assert selectors == {
        "sb": SelectiveBackprop, "infobatch+sb": SelectiveBackprop, "obs": OnlineBatchSelection,
        "sb-proxy": SelectiveBackprop, "rho-loss": RhoLoss, "uniform": SelectiveBackprop,
        "infobatch+uniform": SelectiveBackprop,
    }  # fmt: skip
    assert (
        arms["uniform"].probe_selector().rule == arms["infobatch+uniform"].probe_selector().rule == "uniform"
    )


def test_the_library_names_reach_the_library_objects() -> None:
    ib = parse_methods("infobatch[target=all,warmup_epochs=1,refresh_every=3,max_weight=1.5]")[0]
    assert ib.policy(10, 0) == InfoBatchPolicy(0.5, 10, 0.875, "all", 1, 3, 1.5)
    assert parse_methods("infobatch")[0].policy(10, 0) == InfoBatchPolicy(0.5, 10, 0.875)
    sb = parse_methods("sb[keep=0.7,start=0.1,end=0.8,scale_factor=0.25,interrupt=3]")[0].probe_selector()
    assert (sb.keep, sb.start, sb.end, sb.scale_factor, sb.interrupt) == (0.7, 0.1, 0.8, 0.25, 3)
    rule = parse_methods("obs[keep=0.7,pressure=10,final_pressure=2]")[0].probe_selector().selection_rule
    assert (rule.keep, rule.pressure, rule.final_pressure) == (0.7, 10.0, 2.0)  # type: ignore[attr-defined]


def test_global_options_set_the_arms_that_have_their_setting_and_brackets_win() -> None:
    given = {"prune_ratio": 0.7, "delta": 0.5, "sb_keep": 0.3, "sb_scale": 0.25, "stack_scores": "trained"}
    arms = {a.kind: a.settings for a in parse_methods("infobatch,rs2,seta,sb,obs,infobatch+sb", given)}
    assert (arms["infobatch"]["prune_ratio"], arms["infobatch"]["delta"]) == (0.7, 0.5)
    assert arms["rs2"] == {"prune_ratio": 0.3} and (arms["seta"]["prune_ratio"], arms["seta"]["delta"]) == (
        0.1,
        0.5,
    )
    assert (arms["sb"]["keep"], arms["sb"]["scale_factor"], arms["obs"]["keep"]) == (0.3, 0.25, 0.5)
    assert arms["infobatch+sb"]["stack_scores"] == "trained"
    assert parse_methods("infobatch[prune_ratio=0.2]", given)[0].settings["prune_ratio"] == 0.2
    assert option_setting("delta")[1] == ["random", "infobatch", "infobatch+sb", "seta", "infobatch+uniform"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "no methods"),
        ("fastest", "unknown method 'fastest'; choose from baseline, random"),
        ("sb[keep=2]", "sb[keep=2]: keep must be in (0, 1], got 2.0"),
        ("sb[keep=x]", "keep must be a number"),
        ("sb[start=0.9,end=0.5]", "start must be < end"),
        ("sb[pressure=2]", "pressure applies to obs, obs-epoch only; sb's settings: keep=0.5"),
        ("obs[nope=1]", "unknown setting 'nope'; obs's settings: keep=0.5"),
        ("sb[keep=0.5", "unbalanced"),
        ("infobatch,infobatch", "listed twice"),
        ("sb[keep=0.5,keep=0.6]", "keep is set twice"),
        ("infobatch+sb[stack_scores=both]", "stack_scores must be one of 'selection', 'trained', got 'both'"),
        ("rs2[prune_ratio=1.0]", "rs2[prune_ratio=1.0]: prune_ratio must be in [0, 1), got 1.0"),
        ("sb[interrupt=2.5]", "interrupt must be an integer, got '2.5'"),
        ("sb-proxy[width=0]", "width must be a finite number in (0, 1], got 0.0"),
        ("baseline[budget=0.5,batch=0.5]", "a budget of steps or a batch budget, not both"),
    ],
)
def test_bad_methods_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(ArmError) as e:
        parse_methods(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_number_setting_of_any_kind_takes_nan_or_inf(value: str) -> None:
    for kind in REGISTRY.values():
        for s in kind.settings:
            if s.type in ("float", "optional", "int"):
                with pytest.raises(ArmError, match=f"{s.name} must be"):
                    parse_methods(f"{kind.name}[{s.name}={value}]")


def test_each_twin_is_its_methods_choice_made_uniformly() -> None:
    twins = {
        a.kind: twin_arm(a)
        for a in parse_methods("infobatch[prune_ratio=0.3],sb[keep=0.7],obs,infobatch+sb,rho-loss,rs2")
    }
    assert (twins["infobatch"].kind, twins["infobatch"].settings["prune_ratio"]) == ("random", 0.3)  # type: ignore[union-attr]
    assert twins["sb"].label == "sb[keep=0.7]~uniform" and twins["sb"].probe_selector().rule == "uniform"  # type: ignore[union-attr]
    assert twins["obs"].settings["pressure"] == 1.0 and twins["infobatch+sb"].kind == "infobatch+uniform"  # type: ignore[union-attr]
    assert twins["rho-loss"].kind == "uniform" and twins["rs2"] is None  # type: ignore[union-attr]
    assert twin_arm(parse_methods("obs[pressure=1]")[0]) is None  # its own twin


def test_with_controls_puts_each_twin_after_its_method_and_reuses_an_equal_arm() -> None:
    arms = with_controls(parse_methods("baseline,infobatch,random,sb"))
    assert [(a.label, a.control) for a in arms] == [
        ("baseline", None), ("infobatch", "random"), ("random", None), ("sb", "sb~uniform"), ("sb~uniform", None),
    ]  # fmt: skip
    with pytest.raises(ArmError, match="--controls: none of baseline, rs2 has a uniform twin"):
        with_controls(parse_methods("baseline,rs2"))


def test_budgets_parse_and_add_each_missing_baseline_once() -> None:
    assert parse_budgets("1,0.5,0.7") == [0.5, 0.7, 1.0] and parse_budgets("none") == []
    for bad in ("0", "x", "5", "0.5,0.5", "nan"):
        with pytest.raises(ArmError):
            parse_budgets(bad)
    arms = with_budgets(parse_methods("infobatch,baseline[budget=0.5]"), [0.5, 0.7], [0.5])
    assert [a.label for a in arms] == [
        "baseline[budget=0.5]",
        "baseline[budget=0.7]",
        "baseline[batch=0.5]",
        "infobatch",
    ]


def test_budget_arithmetic() -> None:
    """160 samples in steps of 32: 5 a full epoch, 3 epochs: 15 steps in the full run."""
    short, long, half = Budget(steps=0.45), Budget(steps=1.5), Budget(batch=0.5)
    assert short.total_steps(160, 3, 32) == 7 and [short.served(e, 160, 3, 32) for e in range(3)] == [
        160,
        64,
        0,
    ]
    assert (
        long.total_steps(160, 3, 32) == 23 and long.epochs(160, 3, 32) == 5
    )  # a budget above 1 trains longer
    assert half.rows(32) == 16 and half.total_steps(160, 3, 32) == 15 and half.epochs(160, 3, 32) == 2
    assert [half.served(e, 160, 3, 32) for e in range(3)] == [160, 80, 0]  # 10 steps of 16, then 5
    assert Budget(batch=0.7).rows(5) == 4 and Budget(steps=0.001).total_steps(3, 2, 3) == 1  # halves up; >= 1
    assert Budget(min_batch=2).steps_per_epoch(161, 32) == 5 and Budget().steps_per_epoch(161, 32) == 6
