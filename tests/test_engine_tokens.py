"""Token selection in the engine: ``run.token_loss``, the ``token-selection`` kind and its twin, judged
by ``bench`` on the Tiny Shakespeare example task run on a small synthetic text (no shared data)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from leanbatch import TokenSelection
from leanbatch.arms.methods import parse_methods
from leanbatch.arms.twins import twin_arm
from leanbatch.engine import bench
from leanbatch.engine.running.run import Run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_tasks  # noqa: E402
import shakespeare_task as shakespeare  # noqa: E402

TEXT = (
    "".join(
        f"the {w} sat on the {v} mat, and {w} said: {v}!\n"
        for w in ("cat", "dog", "owl")
        for v in ("red", "big")
    )
    * 12
)
SIZE = shakespeare.Size(seq_len=16, train_windows=40, eval_windows=8, epochs=3, batch_size=8, width=16,
                        layers=1, heads=2, reference_epochs=1)  # fmt: skip


def test_the_kind_its_twin_and_the_arm_build_token_selection():
    arm = parse_methods("token-selection[keep=0.7,start=0.1]")[0]
    ts = arm.token_selection(3)
    assert isinstance(ts, TokenSelection) and (ts.keep, ts.start, ts.end, ts.policy, ts.seed) == (
        0.7,
        0.1,
        1.0,
        "excess",
        3,
    )
    assert arm.selects_tokens and not arm.selects and not arm.prunes and arm.method.family == "tokens"
    twin = twin_arm(arm)
    assert twin is not None and twin.label == "token-selection[keep=0.7,start=0.1]~uniform"
    assert twin.token_selection(3).policy == "random" and twin.settings["keep"] == 0.7
    assert twin_arm(parse_methods("token-selection[policy=random]")[0]) is None  # its own twin
    with pytest.raises(ValueError, match=r"token-selection\[keep=0\]: keep must be in \(0, 1\]"):
        parse_methods("token-selection[keep=0]")
    with pytest.raises(ValueError, match="policy must be one of"):
        parse_methods("token-selection[policy=top]")


def test_bench_judges_token_selection_and_charges_the_reference():
    task = shakespeare.make_task(TEXT, SIZE)
    report = bench(task, methods="baseline,infobatch,token-selection", seeds=[0], budgets="1,1.5",
                   batch_budgets="none", controls=True, metric="eval_loss", plots=False)  # fmt: skip
    runs = {r["method"]: r for r in report["runs"]}
    assert set(runs) == {"baseline", "baseline[budget=1.5]", "infobatch", "infobatch~random",
                         "token-selection", "token-selection~uniform"}  # fmt: skip
    steps = SIZE.epochs * (SIZE.train_windows // SIZE.batch_size)
    method, twin = runs["token-selection"], runs["token-selection~uniform"]
    held = len(range(0, SIZE.train_windows, 10)) * SIZE.reference_epochs  # the reference's training
    # every step's reference forward (its rows) and the reference's training are charged
    assert method["charged"] == {
        "forwarded": steps * SIZE.batch_size + held,
        "backpropagated": held,
        "cost": 1.0,
    }
    assert twin["charged"] == {} and twin["work_fraction"] == 1.0 == runs["baseline"]["work_fraction"]
    assert (
        method["work_fraction"] > 1.0
        and method["counts"]["backpropagated"] == SIZE.epochs * SIZE.train_windows
    )
    assert (method["notes"], twin["notes"]) == (
        {"token_keep": 0.6, "token_policy": "excess"}, {"token_keep": 0.6, "token_policy": "random"}
    )  # fmt: skip
    assert runs["infobatch"]["counts"]["loaded"] < runs["baseline"]["counts"]["loaded"]  # InfoBatch pruned
    rows = {r["method"]: r for r in report["controls"]["rows"]}
    assert rows["token-selection"]["control"] == "token-selection~uniform"
    placed = {r["method"]: r["per_seed"][0]["range"] for r in report["envelope"]["rows"]}
    assert placed["token-selection"] != "none"  # placed on the baseline's curve, up to budget 1.5


def test_a_token_arm_trained_without_the_hook_stops_the_study_naming_it():
    with pytest.raises(ValueError, match=r"run.token_loss\(ds, logits, labels\), the token hook"):
        bench(engine_tasks.train, methods="baseline,token-selection", seeds=[0], budgets="1",
              batch_budgets="none", plots=False)  # fmt: skip


def test_token_loss_for_the_other_arms_is_each_sequences_mean_through_the_data():
    run = Run(parse_methods("baseline")[0], seed=0)
    ds = run.wrap(list(range(4)), 1)
    run.batch_size(4)
    list(ds.sampler)
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 6, 5), torch.randint(0, 5, (4, 6))
    loss = run.token_loss(ds, logits, labels, reference=lambda: pytest.fail("a baseline calls no reference"))
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 5), labels[:, 1:].reshape(-1))
    assert float(loss) == pytest.approx(float(want), rel=1e-6) and ds.counts.steps == 1 and run.charged == {}
