"""The built-in image task on the run contract: its schedule step by step, its budget arms' steps and
batches, the LR rule, RHO-LOSS's holdout model charged to the run, the models and augmentation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from leanbatch.engine.study import bench
from leanbatch.schedule import cosine
from leanbatch.tasks.images.config import TrainConfig
from leanbatch.tasks.images.data import load_data
from leanbatch.tasks.images.irreducible import flop_share
from leanbatch.tasks.images.loop import augment
from leanbatch.tasks.images.models import CompactResNet, SmallCNN, build_model, default_model_name
from leanbatch.tasks.images.task import ImageTask


@pytest.fixture(autouse=True)
def _denormals() -> Iterator[None]:
    yield
    torch.set_flush_denormal(False)  # the task flushes denormals in the thread it trains in


def _study(methods: str, cfg: TrainConfig, n: int = 160, **kw: object) -> dict:  # type: ignore[type-arg]
    task = ImageTask(load_data("digits", limit_train=n, limit_test=40), cfg)
    return bench(
        task,
        methods=methods,
        metric="accuracy",
        budgets=kw.pop("budgets", "none"),
        batch_budgets="none",
        **kw,
    )  # type: ignore[arg-type]


def test_the_schedule_warms_up_from_zero_and_ends_at_zero_step_by_step() -> None:
    """The loop's LR is the library's ``cosine(warmup=)`` of its own progress, by batches of each epoch."""
    cfg = TrainConfig(epochs=2, batch_size=32, widths=(4,), warmup=0.3)
    seen: list[float] = []
    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"])
    )
    try:
        report = _study("baseline", cfg)  # 5 steps of 32 an epoch (the warm-up's steps have lr 0)
    finally:
        handle.remove()
    trained = seen[-10:]
    shape = cosine(warmup=0.3)
    assert trained == [cfg.lr * shape((e + i / 5) / 2) for e in range(2) for i in range(5)]
    assert trained[0] == 0.0 and trained[1] == pytest.approx(cfg.lr * 0.1 / 0.3)
    assert report["runs"][0]["epochs"][-1]["values"]["lr"] == trained[-1]


def test_budget_arms_train_their_share_of_steps_with_their_own_schedule() -> None:
    cfg = TrainConfig(epochs=3, batch_size=32, widths=(4,))
    report = _study("baseline,infobatch", cfg, budgets="0.45,1.5,1")
    runs = {r["method"]: r for r in report["runs"]}
    steps = {label: [e["steps"] for e in r["epochs"]] for label, r in runs.items()}
    assert steps["baseline"] == [5, 5, 5] and steps["baseline[budget=0.45]"] == [5, 2]  # round(0.45 x 15) = 7
    assert steps["baseline[budget=1.5]"] == [5, 5, 5, 5, 3]  # a budget above 1 trains longer
    assert runs["baseline[budget=0.45]"]["loaded_fraction"] == pytest.approx(7 * 32 / 480)
    assert runs["baseline[budget=1.5]"]["backward_fraction"] == pytest.approx(23 * 32 / 480)
    lr = {label: [e["values"]["lr"] for e in r["epochs"]] for label, r in runs.items()}
    for label in ("baseline", "baseline[budget=0.45]", "baseline[budget=1.5]"):
        assert lr[label][-1] < 0.15 * cfg.lr, label  # every schedule ends at its own end
    assert lr["baseline[budget=0.45]"][0] < lr["baseline"][0] < lr["baseline[budget=1.5]"][0]
    assert len(runs["infobatch"]["epochs"]) == 3 and runs["infobatch"]["loaded_fraction"] < 1


@pytest.mark.parametrize("rule", ["same", "scaled"])
def test_a_batch_budget_trains_the_full_runs_steps_on_smaller_batches_its_lr_by_the_rule(rule: str) -> None:
    cfg = TrainConfig(epochs=3, batch_size=32, widths=(8,), warmup=0.0, lr_rule=rule)
    task = ImageTask(load_data("digits", 320, 60), cfg)
    report = bench(
        task, methods="baseline,obs[keep=0.5]", budgets="1", batch_budgets="0.5", metric="accuracy"
    )
    runs = {r["method"]: r for r in report["runs"]}
    full, half, obs = runs["baseline"], runs["baseline[batch=0.5]"], runs["obs[keep=0.5]"]
    assert [e["steps"] for e in full["epochs"]] == [10, 10, 10]
    assert [e["steps"] for e in half["epochs"]] == [20, 10] and [e["forwarded"] for e in half["epochs"]] == [
        320,
        160,
    ]
    assert half["work_fraction"] == pytest.approx(0.5)
    factor = 0.5 if rule == "scaled" else 1.0  # 16 of 32 rows every step (obs selects on every batch)
    lr = lambda r: [e["values"]["lr"] for e in r["epochs"]]  # noqa: E731
    assert lr(half)[0] == pytest.approx(factor * lr(full)[1])  # step 20 of 30 in both
    assert lr(obs) == pytest.approx([factor * x for x in lr(full)])


def test_rho_loss_charges_its_holdout_model_and_obs_epoch_prunes_whole_epochs() -> None:
    cfg = TrainConfig(epochs=3, batch_size=32, widths=(8, 16))
    task = ImageTask(load_data("digits", 320, 60), cfg)
    report = bench(
        task,
        methods="baseline,obs-epoch,rho-loss[il_epochs=2]",
        metric="accuracy",
        budgets="none",
        batch_budgets="none",
    )
    runs = {r["method"]: r for r in report["runs"]}
    epoch = runs["obs-epoch"]
    assert [e["loaded"] for e in epoch["epochs"]] == [224] * 3 and [e["steps"] for e in epoch["epochs"]] == [
        7
    ] * 3
    rho = runs["rho-loss[il_epochs=2]"]
    assert rho["notes"]["holdout"] == 32 and rho["charged"]["forwarded"] == 2 * 32 + 320
    assert rho["charged"]["backpropagated"] == 64 and 0 < rho["charged"]["cost"] < 1
    trained = sum(e["backpropagated"] for e in rho["epochs"])
    assert trained == 3 * 160  # half of each batch, every batch
    full = 3 * 320
    work = (trained + 3 * 320 + 2 * trained + (2 * 32 + 320 + 2 * 64) * rho["charged"]["cost"]) / (3 * full)
    assert rho["work_fraction"] == pytest.approx(
        work
    )  # the selection forward at full size, the holdout model
    assert rho["backward_fraction"] == pytest.approx((trained + 64) / full)
    assert all(r["metric"] > 25.0 for r in runs.values())  # every arm learned (chance: 10%)


def test_the_flops_of_a_model_at_its_own_widths_are_counted() -> None:
    """Regression: counted in training mode on one sample, which BatchNorm refuses at a 1x1 map."""
    data = load_data("digits", 64, 16)
    assert 0 < flop_share(data, TrainConfig(), TrainConfig().scaled_widths(data, 0.5)) < 1


@pytest.mark.parametrize("size", [8, 14, 28])
def test_the_small_cnn_takes_any_size(size: int) -> None:
    model = SmallCNN(1, 10, (4, 8, 8))
    assert model(torch.randn(2, 1, size, size)).shape == (2, 10)
    assert model(torch.randn(2, 1, size // 2, size // 2)).shape == (2, 10)  # SB's downsampled pass


def test_the_resnet_and_the_defaults() -> None:
    assert default_model_name(3, 32) == "resnet" and default_model_name(1, 28) == "cnn"
    net = build_model("resnet", 3, 10, (8, 16, 16))
    assert isinstance(net, CompactResNet) and net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vit", 3, 10)


def test_augmentation_crops_and_flips_each_image_of_its_own() -> None:
    b, h, w = 24, 8, 10
    x = torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(1))
    out = augment(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype
    found = []
    for i in range(b):  # the one (flip, dy, dx) that reproduces image i from its 4-pixel reflect padding
        matches = [
            (flip, dy, dx) for flip in (False, True) for dy in range(9) for dx in range(9)
            if torch.equal(out[i], F.pad((x[i].flip(-1) if flip else x[i])[None], (4, 4, 4, 4), mode="reflect")[0, :, dy : dy + h, dx : dx + w])
        ]  # fmt: skip
        assert len(matches) == 1, (i, matches)
        found.append(matches[0])
    assert {f for f, _, _ in found} == {False, True} and len({(dy, dx) for _, dy, dx in found}) > b // 2
    assert torch.equal(out, augment(x, torch.Generator().manual_seed(0)))  # the generator decides


def test_an_unknown_lr_rule_is_refused_when_the_config_is_built() -> None:
    """Any lr_rule but "scaled" once trained silently as "same" (a misspelt "scale" included)."""
    with pytest.raises(ValueError, match=r"lr_rule must be one of 'same', 'scaled', got 'scale'"):
        TrainConfig(lr_rule="scale")
    assert TrainConfig(lr_rule="scaled").lr_rule == "scaled"
