"""Benchmark building blocks: method parsing, models, the LR schedule, the summary, micro-benchmarks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from leanbatch.bench import train as train_mod
from leanbatch.bench.data import load_data
from leanbatch.bench.interleave import train_interleaved
from leanbatch.bench.loop_parts import augment as _augment
from leanbatch.bench.loop_parts import snapshot_epochs
from leanbatch.bench.methods import MethodError, parse_methods
from leanbatch.bench.models import CompactResNet, SmallCNN, build_model, default_model_name
from leanbatch.bench.report import format_table, summarize
from leanbatch.bench.train import (
    EpochRecord,
    RunResult,
    TrainConfig,
    budget_steps,
)
from leanbatch.micro import overheads as micro
from leanbatch.schedule import cosine


def test_parse_methods_defaults_and_overrides() -> None:
    specs = parse_methods(
        "baseline, infobatch ,infobatch+sb[sb_keep=0.3,sb_interrupt=0]", {"prune_ratio": 0.7}
    )
    assert [s.label for s in specs] == ["baseline", "infobatch", "infobatch+sb[sb_keep=0.3,sb_interrupt=0]"]
    assert specs[1].settings["prune_ratio"] == 0.7 and specs[1].prunes and not specs[1].selects
    assert specs[2].settings["keep"] == 0.3 and specs[2].settings["interrupt"] == 0
    assert specs[2].prunes and specs[2].selects
    assert specs[0].settings == {"budget": 1.0, "batch": 1.0}
    assert set(specs[2].settings) >= {"prune_ratio", "keep", "stack_scores"}
    assert set(specs[2].config()) >= {
        "prune_ratio",
        "sb_keep",
        "stack_scores",
    }  # results.json's keys, as before
    assert type(parse_methods("random")[0].make_policy(8, 0)).__name__ == "RandomPolicy"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "no methods"),
        ("base", "unknown method 'base'"),
        ("sb[sb_keep=2]", "keep must be in (0, 1]"),
        ("sb[sb_keep=x]", "must be a number"),
        ("sb[sb_start=0.9,sb_end=0.5]", "start must be < end"),
        ("sb[sb_start=0.5,sb_end=0.5]", "start must be < end"),
        ("sb[nope=0.5]", "unknown setting"),
        ("sb[sel_keep=0.5]", "sel_keep applies to obs, sb-proxy only"),
        ("sb[sb_keep=0.5", "unbalanced"),
        ("infobatch,infobatch", "listed twice"),
        ("infobatch+sb[stack_scores=both]", "stack_scores"),
    ],
)
def test_parse_methods_errors(text: str, needle: str) -> None:
    with pytest.raises(MethodError, match=None) as exc:
        parse_methods(text)
    assert needle in str(exc.value)


@pytest.mark.parametrize("size", [8, 14, 28])
def test_small_cnn_takes_any_size(size: int) -> None:
    model = SmallCNN(1, 10, (4, 8, 8))
    assert model(torch.randn(2, 1, size, size)).shape == (2, 10)
    assert model(torch.randn(2, 1, size // 2, size // 2)).shape == (2, 10)  # SB's downsampled pass


def test_resnet_and_defaults() -> None:
    assert default_model_name(3, 32) == "resnet" and default_model_name(1, 28) == "cnn"
    net = build_model("resnet", 3, 10, (8, 16, 16))
    assert isinstance(net, CompactResNet) and net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vit", 3, 10)


def test_lr_schedule_warms_up_then_ends_at_zero() -> None:
    """The loop's learning rate is the library's ``cosine(warmup=)`` of its own progress, step by step."""
    data = load_data("digits", limit_train=160, limit_test=40)  # 5 steps of 32 per epoch
    cfg = TrainConfig(epochs=2, batch_size=32, widths=(4,), histogram_epochs=0, warmup=0.3)
    trainer = train_mod.Trainer(data, parse_methods("baseline")[0], 0, cfg)
    seen: list[tuple[float, float]] = []  # (progress, LR) at every optimizer step
    trainer.opt.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append((trainer.progress, opt.param_groups[0]["lr"]))
    )
    try:
        records = [trainer.run_epoch() for _ in range(2)]
    finally:
        torch.set_flush_denormal(False)
    assert [p for p, _ in seen] == [(e + i / 5) / 2 for e in range(2) for i in range(5)]
    shape = cosine(warmup=0.3)
    assert [lr for _, lr in seen] == [cfg.lr * shape(p) for p, _ in seen]
    assert seen[0][1] == 0.0 and seen[1][1] == pytest.approx(cfg.lr * 0.1 / 0.3)  # warm-up from 0
    assert records[-1].lr == seen[-1][1] and trainer.opt.param_groups[0]["lr"] == 0.0  # ends at zero


def test_augment_keeps_shape_and_content() -> None:
    b, h, w = 24, 8, 10
    x = torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(1))
    out = _augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype
    # each image is its own image, flipped or not, cropped from its 4-pixel reflect padding: find
    # the one (flip, dy, dx) that reproduces it exactly
    found = []
    for i in range(b):
        matches = [
            (flip, dy, dx)
            for flip in (False, True)
            for dy in range(9)
            for dx in range(9)
            if torch.equal(
                out[i],
                F.pad((x[i].flip(-1) if flip else x[i])[None], (4, 4, 4, 4), mode="reflect")[
                    0, :, dy : dy + h, dx : dx + w
                ],
            )
        ]
        assert len(matches) == 1, (i, matches)  # content from image i (not another image's), one crop
        found.append(matches[0])
    # randomness per image: both flips and many offsets occur
    assert {f for f, _, _ in found} == {False, True}
    assert len({(dy, dx) for _, dy, dx in found}) > b // 2
    assert torch.equal(out, _augment(x, torch.Generator().manual_seed(0)))  # the generator decides


def test_snapshot_epochs_are_pruning_epochs() -> None:
    spec = parse_methods("infobatch")[0]
    assert snapshot_epochs(spec.make_policy(8, 0), 8, 3) == {
        1,
        3,
        6,
    }  # epochs 1..6 prune (epoch 0 is unscored)
    assert snapshot_epochs(None, 8, 3) == set()  # a row that does not prune
    assert snapshot_epochs(spec.make_policy(2, 0), 2, 3) == set()
    assert snapshot_epochs(parse_methods("rs2")[0].make_policy(8, 0), 8, 3) == {
        1,
        4,
        7,
    }  # RS2 prunes every epoch


def test_budget_runs_train_their_share_of_steps_with_their_own_schedule() -> None:
    data = load_data("digits", limit_train=160, limit_test=40)  # 5 steps of 32 per epoch
    cfg = TrainConfig(epochs=3, batch_size=32, widths=(4,), histogram_epochs=0)
    specs = parse_methods("baseline,baseline[budget=0.45],baseline[budget=1.5],infobatch")
    try:
        full, short, long, ib = train_interleaved(data, specs, seed=0, cfg=cfg)
    finally:
        torch.set_flush_denormal(False)
    assert [e.steps for e in full.epochs] == [5, 5, 5]
    assert budget_steps(0.45, 3, 5) == 7 and [e.steps for e in short.epochs] == [5, 2]
    assert [e.steps for e in long.epochs] == [5, 5, 5, 5, 3]  # a budget above 1 trains longer
    # work as a share of the full baseline's 3 x 160 samples
    assert short.budget == 0.45 and short.totals()["loaded_fraction"] == pytest.approx(7 * 32 / 480)
    assert long.totals()["backward_fraction"] == pytest.approx(23 * 32 / 480)
    # every schedule ends at its own end; the short one is already lower after its first epoch
    for run in (full, short, long):
        assert run.epochs[-1].lr < 0.15 * cfg.lr
    assert short.epochs[0].lr < full.epochs[0].lr < long.epochs[0].lr
    assert len(ib.epochs) == 3 and ib.budget == 1.0


def test_runs_of_different_lengths_interleave_over_the_same_span(monkeypatch: pytest.MonkeyPatch) -> None:
    data = load_data("digits", limit_train=160, limit_test=40)  # 5 steps of 32 per epoch
    cfg = TrainConfig(epochs=3, batch_size=32, widths=(4,), histogram_epochs=0)
    order: list[tuple[str, int]] = []
    real = train_mod.Trainer.run_epoch

    def logged(self: train_mod.Trainer, *args: object, **kwargs: object) -> EpochRecord:
        order.append((self.row.label, len(self.records)))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(train_mod.Trainer, "run_epoch", logged)
    specs = parse_methods("baseline,infobatch,baseline[budget=0.4]")  # the budget run: 6 steps = 5 + 1
    try:
        train_interleaved(data, specs, seed=0, cfg=cfg)
    finally:
        torch.set_flush_denormal(False)
    # epoch midpoints as fractions of each run: full runs 1/6, 3/6, 5/6; the budget run 2.5/6, 5.5/6
    full, ib, short = (s.label for s in specs)
    assert order == [
        (full, 0), (ib, 0), (short, 0), (full, 1), (ib, 1), (full, 2), (ib, 2), (short, 1)
    ]  # fmt: skip


def _run(label: str, seed: int, accs: list[float], times: list[float], loaded: int, bwd: int) -> RunResult:
    epochs = [
        EpochRecord(
            epoch=i, train_time=t, train_cpu_time=t, test_acc=a, test_loss=0.1, train_loss=0.1, steps=1,
            loaded=loaded, forwarded=loaded, select_forwarded=0, backpropagated=bwd, lr=0.0,
        )
        for i, (a, t) in enumerate(zip(accs, times, strict=True))
    ]  # fmt: skip
    return RunResult(label=label, kind=label, seed=seed, num_train=100, epochs=epochs)


def test_summary_ratios_and_time_to_target() -> None:
    runs = [
        _run("baseline", 0, [90.0, 95.0, 98.0], [10.0, 20.0, 30.0], 100, 100),
        _run("baseline", 1, [90.0, 96.0, 98.2], [10.0, 20.0, 30.0], 100, 100),
        _run("infobatch", 0, [90.0, 97.95, 98.0], [6.0, 12.0, 20.0], 60, 60),
        _run("infobatch", 1, [90.0, 97.0, 97.5], [6.0, 12.0, 20.0], 60, 60),
    ]
    rows = summarize(runs, tolerance=0.2)
    base, ib = rows
    assert base["time_ratio_vs_baseline"] == pytest.approx(1.0)
    assert base["target_acc"] == pytest.approx(97.9)
    assert base["time_to_target_s"] == pytest.approx(30.0)
    assert ib["time_ratio_vs_baseline"] == pytest.approx(20.0 / 30.0)
    assert ib["work_fraction"] == pytest.approx(0.6)
    assert ib["ideal_speedup"] == pytest.approx(1 / 0.6)
    assert ib["achieved_of_ideal"] == pytest.approx(1.5 * 0.6)
    assert ib["acc_std"] == pytest.approx(math.sqrt(0.125))
    assert ib["time_to_target_s"] is None and ib["reached_target"] == 1  # seed 1 never reached 97.9
    table = format_table(rows, 0.2)
    assert "| infobatch |" in table and "-33.3%" in table and "- (1/2)" in table


def test_selection_work_is_flop_weighted() -> None:
    run = _run("sb", 0, [90.0], [1.0], 100, 50)
    run.epochs[0].forwarded = 50
    run.epochs[0].select_forwarded = 100
    run.sb_scale = 0.5
    tot = run.totals()
    assert tot["forward_fraction"] == pytest.approx(1.5) and tot["backward_fraction"] == pytest.approx(0.5)
    assert tot["work_fraction"] == pytest.approx((50 + 25 + 100) / 300)


def test_micro_update_and_select_run() -> None:
    rows = micro.bench_update(num_samples=5000, batch_size=64, steps=30)
    assert [r["what"] for r in rows][0].startswith("loss.mean")
    assert all(r["us_per_step"] > 0 for r in rows) and "update(loss)" in micro.format_update(rows)
    rows = micro.bench_select(batch_size=16, steps=2)
    assert rows[0]["of_full_step"] == 1.0 and "selection pass" in micro.format_select(rows)


def test_micro_plan_in_a_subprocess() -> None:
    rows = micro.bench_plan([20000], repeats=1)
    assert "error" not in rows[0], rows[0]
    assert 0 < rows[0]["kept"] < 20000 and rows[0]["plan_s_best"] > 0
    assert "20,000" in micro.format_plan(rows)


def test_bench_imports_no_private_names_and_has_no_cycle() -> None:
    """Within the bench and the command: no module imports another's private (``_``) name, and the
    import graph of ``leanbatch.bench`` (module level and inside functions alike) has no cycle."""
    import ast
    from pathlib import Path

    import leanbatch

    root = Path(leanbatch.__file__).parent
    files = [
        *sorted((root / "bench").glob("*.py")),
        root / "cli.py",
        root / "cli_args.py",
        root / "cli_bench.py",
        root / "cli_checks.py",
    ]
    graph: dict[str, set[str]] = {}
    for path in files:
        name = f"leanbatch.{path.relative_to(root).with_suffix('').as_posix().replace('/', '.')}"
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("leanbatch"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{name} imports {private} from {node.module}"
                graph[name].add(node.module or "")
    bench = {
        m: {d for d in deps if d.startswith("leanbatch.bench")} for m, deps in graph.items() if ".bench" in m
    }

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        for dep in bench.get(module, ()):
            visit(dep, (*path, module))

    for module in bench:
        visit(module, ())
