"""The Lightning adapter with the real ``Trainer.fit``: each Lightning behaviour the adapter handles.

The fits are tiny (240 samples, 4 epochs, batches of 16, a linear model), with losses that
name their sample (``lightning_job.identity_loss``), so every check is on exact values:
which samples each batch held, the weighted losses returned, the scores and the plans.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning_job import (  # noqa: E402
    BS,
    EPOCHS,
    N,
    identity_loss,
    make_data,
    make_module,
    make_trainer,
    quiet,
)
from torch.utils.data import DataLoader  # noqa: E402

from leanbatch import InfoBatch, ProgressLR, SelectiveBackprop, cosine  # noqa: E402
from leanbatch.lightning import LeanBatchCallback  # noqa: E402

quiet()


def infobatch() -> InfoBatch:
    return InfoBatch(make_data(), EPOCHS, prune_ratio=0.6, delta=0.75, seed=11)


def callback(sb: bool = False) -> LeanBatchCallback:
    selection = SelectiveBackprop(start=0.3, end=0.9, keep=0.5, scale_factor=1.0, interrupt=2, seed=3)
    return LeanBatchCallback(infobatch(), selection if sb else None)


def oracle() -> tuple[list[tuple], list[dict], torch.Tensor]:
    """The same training as a plain loop over the core: batches, returned losses, plans, scores."""
    ds = infobatch()
    loader = DataLoader(ds, batch_size=BS, sampler=ds.sampler)
    rows = []
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        for i, (x, _) in enumerate(loader):
            idx = x[:, 0].long().tolist()
            out = ds.update(identity_loss(x, epoch))
            rows.append((epoch, i, idx, idx, round(float(out), 6)))
    return rows, ds.epoch_stats, ds.scores.values.clone()


@pytest.fixture(scope="module")
def reference() -> tuple[list[tuple], list[dict], torch.Tensor]:
    return oracle()


def lengths(rows: list[tuple]) -> list[int]:
    return [sum(1 for r in rows if r[0] == e) for e in range(EPOCHS)]


@pytest.mark.parametrize("workers", [0, 2])
def test_fit_trains_exactly_the_plain_loop_run(reference, workers):
    """Lightning reads the loader's length before iterating and fixes it at set-up; pruned epochs
    still end on their plan, every epoch validates, and each score lands on its own sample."""
    ref_rows, ref_stats, ref_scores = reference
    assert lengths(ref_rows) == [15, 12, 11, 15]  # two pruned epochs between full ones
    lb = callback()
    module = make_module(lb, workers=workers, val=True)
    make_trainer([lb]).fit(module)
    assert module.rows == ref_rows  # same batches, same weighted losses, in the same order
    assert lb.infobatch.epoch_stats == ref_stats
    assert torch.equal(lb.infobatch.scores.values, ref_scores)
    assert module.val_runs == EPOCHS  # Lightning alone would skip validation in pruned epochs


def steps_of(path: Path) -> int:
    return int(re.search(r"step=(\d+)", path.name).group(1))  # type: ignore[union-attr]


class Saver(ModelCheckpoint):
    """Several ModelCheckpoints in one Trainer need their own state keys."""

    @property
    def state_key(self) -> str:
        return f"Saver[{self.filename}]"


def test_resume_from_lightning_checkpoints_reproduces_the_uninterrupted_fit(tmp_path):
    """Mid-epoch (Lightning restarts a plain DataLoader at the epoch start), at the last batch of
    a pruned epoch, at a train-epoch-end and at a validation-end checkpoint: the resumed fit
    trains the same batches with the same weights, selections, scores and plans, and ends
    with the same model. Both methods are stacked and the loss is a real one."""
    lb = callback(sb=True)
    module = make_module(lb, loss="ce", val=True)
    savers = [
        Saver(dirpath=tmp_path, filename="s{step}", every_n_train_steps=1, save_top_k=-1),
        Saver(dirpath=tmp_path, filename="end{epoch}", save_on_train_epoch_end=True, save_top_k=-1),
        Saver(dirpath=tmp_path, filename="val{epoch}", save_on_train_epoch_end=False, save_top_k=-1),
    ]
    make_trainer([lb, *savers]).fit(module)
    ref_rows, ref_stats = module.rows, lb.infobatch.epoch_stats
    ref_scores, ref_weight = lb.infobatch.scores.values.clone(), module.net.weight.detach().clone()
    assert lengths(ref_rows) == [15, 12, 11, 15]
    assert any(r[2] != r[3] for r in ref_rows)  # Selective Backprop dropped rows
    by_step = {steps_of(p): p for p in tmp_path.glob("s*.ckpt")}
    chosen = [
        by_step[20],  # inside pruned epoch 1
        by_step[27],  # after the last batch of pruned epoch 1 (saved at train-batch end)
        by_step[31],  # inside pruned epoch 2
        tmp_path / "endepoch=0.ckpt",  # at the end of full epoch 0 (train-epoch end)
        tmp_path / "valepoch=2.ckpt",  # at the end of pruned epoch 2 (validation end)
    ]
    for path in chosen:
        state = torch.load(path, weights_only=True)  # tensors and plain values only
        assert state["callbacks"]["LeanBatchCallback"]["infobatch"]["sampler"]["epoch"] in range(EPOCHS)
        lb2 = callback(sb=True)
        module2 = make_module(lb2, loss="ce", val=True)
        make_trainer([lb2]).fit(module2, ckpt_path=path)
        done = state["global_step"]
        assert module2.rows == ref_rows[done:], path.name  # the rest of the fit, batch for batch
        assert lb2.infobatch.epoch_stats == ref_stats, path.name
        assert torch.equal(lb2.infobatch.scores.values, ref_scores), path.name
        assert torch.equal(module2.net.weight, ref_weight), path.name
        assert lb2.selective_backprop.state_dict()["draws"] == lb.selective_backprop.state_dict()["draws"]


def test_gradient_accumulation_steps_on_the_last_partial_group_of_pruned_epochs():
    """accumulate_grad_batches=3 with epochs of 15, 12, 11 and 15 batches: 5 + 4 + 4 + 5 optimiser
    steps, nothing left over for the next epoch, and a progress-driven LR that ends at zero
    where a step count fixed at set-up would have planned for more steps."""
    lb = callback()
    module = make_module(lb)
    lrs: list[float] = []

    def configure_optimizers() -> Any:
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        sched = ProgressLR(opt, lb, cosine(warmup=0.1))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    module.configure_optimizers = configure_optimizers
    module.on_train_batch_end = lambda *a: lrs.append(module.optimizers().param_groups[0]["lr"])
    trainer = make_trainer([lb], accumulate_grad_batches=3)
    trainer.fit(module)
    per_epoch = lengths(module.rows)
    assert per_epoch == [15, 12, 11, 15]
    steps = [math.ceil(n / 3) for n in per_epoch]
    assert module.steps_at_epoch_end == [sum(steps[: e + 1]) for e in range(EPOCHS)]  # 5, 9, 13, 18
    assert module.grads_at_epoch_start[1:] == [0.0] * (EPOCHS - 1)  # no gradient carried over
    assert lrs[-1] == 0.0 and max(lrs) == pytest.approx(0.1, rel=0.05)
    assert trainer.estimated_stepping_batches == 5 * EPOCHS > trainer.global_step == 18


@pytest.fixture
def process_group_cleanup():
    """An in-process DDP fit leaves a process group, environment variables and a torch thread count."""
    env, threads = dict(os.environ), torch.get_num_threads()
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)


def test_lightnings_distributed_sampler_replacement_is_refused_with_the_setting_to_use(process_group_cleanup):
    lb = callback()
    module = make_module(lb)
    with pytest.raises(RuntimeError, match=r"DistributedSamplerWrapper.*use_distributed_sampler=False"):
        make_trainer([lb], strategy="ddp").fit(
            module
        )  # one replica: Lightning wraps the sampler all the same
    assert module.rows == [] and lb.infobatch.scores.num_scored() == 0  # stopped before training


def run_job(*args: str) -> None:
    """``python tests/lightning_job.py *args``: Lightning's own launcher starts the other processes."""
    job = Path(__file__).with_name("lightning_job.py")
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "MASTER_PORT", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(job.parent), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, str(job), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]


def ddp_job(out: Path, *resume: str) -> None:
    """The 2-process job of ``lightning_job.ddp_main``."""
    run_job(str(out), *resume)


def test_ddp_two_processes_plan_alike_merge_scores_draw_independently_and_resume(tmp_path):
    """``strategy="ddp"``, 2 CPU processes (gloo), both methods stacked; then a fit resumed from
    rank 0's checkpoint inside a pruned epoch continues every rank exactly, with the scores carried
    in DDP's gradient all-reduce (``carry_scores=True``) where the first fit all-gathered them."""
    ddp_job(tmp_path)
    a, b = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    assert a["world"] == b["world"] == 2
    assert a["carried"] is None and b["carried"] is None  # carry_scores is off: each step's all-gather
    assert a["stats"] == b["stats"]  # every rank planned the same epochs
    stats = a["stats"]
    assert any(s["pruning"] and s["kept"] < 203 for s in stats)
    previous = torch.full((203,), float("nan"))
    for e in range(EPOCHS):
        ra, rb = ([r for r in x["rows"] if r[0] == e] for x in (a, b))
        assert len(ra) == len(rb)  # equal shards: no rank waits for a batch the other never has
        served_a = [i for r in ra for i in r[2]]
        served_b = [i for r in rb for i in r[2]]
        assert len(served_a) == len(served_b) == math.ceil(stats[e]["kept"] / 2)
        assert len(served_a) % BS != 0  # the epoch ends on a short batch on both ranks
        assert len(set(served_a) | set(served_b)) == stats[e]["kept"]
        sa, sb = a["scores"][e], b["scores"][e]
        torch.testing.assert_close(sa, sb, equal_nan=True, rtol=0, atol=0)  # merged on every rank
        # each score is the loss of the rank that trained the sample (identity + rank), and the
        # previous score where neither did; padding (rank 1's shard ends with a sample served a
        # second time, so the shards have equal lengths) trains but does not score
        padded = stats[e]["padded"]
        assert padded == 1
        ranks: dict[int, list[int]] = {}
        for rank, rows in ((0, ra), (1, rb)):
            for r in rows:
                last = rank == 1 and r is rows[-1]
                for i in r[3]:
                    if not (last and r[2].index(i) >= len(r[2]) - padded):
                        ranks.setdefault(i, []).append(rank)
        expected = previous.clone()
        ids = torch.tensor(sorted(ranks))
        mean_rank = torch.tensor([sum(ranks[i]) / len(ranks[i]) for i in sorted(ranks)])
        expected[ids] = identity_loss(ids[:, None].float(), e) + mean_rank
        torch.testing.assert_close(sa, expected, equal_nan=True)
        previous = sa
    # Selective Backprop draws per rank: with all selection losses equal, only the draws decide
    pos = [[[r[2].index(i) for i in r[3]] for r in x["rows"] if r[2] != r[3]] for x in (a, b)]
    assert len(pos[0]) > 10 and sum(p == q for p, q in zip(*pos, strict=True)) <= 1

    first_pruned = next(e for e, s in enumerate(stats) if s["kept"] < 203)
    step = len([r for r in a["rows"] if r[0] < first_pruned]) + 2  # two batches into a pruned epoch
    ddp_job(tmp_path, str(tmp_path / "saved" / f"step={step}.ckpt"), "--carry")
    for r, full in enumerate((a, b)):
        resumed = torch.load(tmp_path / f"resumed{r}.pt", weights_only=False)
        assert resumed["carried"][0] > 0  # the scores rode DDP's all-reduce
        assert resumed["rows"] == full["rows"][step:]  # this rank's own shard, batch for batch
        assert resumed["stats"] == stats
        for x, y in zip(resumed["scores"], full["scores"][first_pruned:], strict=True):
            torch.testing.assert_close(x, y, equal_nan=True, rtol=0, atol=0)


def test_per_epoch_statistics_reach_the_trainers_loggers(tmp_path):
    lb = callback(sb=True)
    module = make_module(lb, loss="ce")
    make_trainer([lb], logger=CSVLogger(tmp_path, name="", version="")).fit(module)
    import csv

    with open(tmp_path / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["leanbatch/pruned_so_far"]]
    assert [int(r["epoch"]) for r in rows] == list(range(EPOCHS))
    kept = [float(r["leanbatch/kept_fraction"]) for r in rows]
    assert kept == pytest.approx([s["kept"] / N for s in lb.infobatch.epoch_stats])  # logged as float32
    assert float(rows[-1]["leanbatch/pruned_so_far"]) == lb.infobatch.get_pruned_count() > 0
    assert [r["leanbatch/threshold"] != "nan" for r in rows] == [
        s["pruning"] for s in lb.infobatch.epoch_stats
    ]
    fractions = [float(r["leanbatch/sb_backprop_fraction"]) for r in rows]
    assert fractions[0] == 1.0 and min(fractions) < 1.0  # the window opens at 30% of training
    assert float(rows[-1]["leanbatch/sb_skipped_so_far"]) == lb.selective_backprop.stats.skipped > 0
    assert sum(float(r["leanbatch/sb_selection_time_s"]) for r in rows) == pytest.approx(lb.select_time_s)


def test_dict_batches_carry_their_index_under_a_key():
    class Dicts(torch.utils.data.Dataset):
        data = make_data()

        def __len__(self) -> int:
            return N

        def __getitem__(self, i: int) -> dict[str, Any]:
            x, y = self.data[i]
            return {"x": x, "labels": y}

    sb = SelectiveBackprop(start=0.0, keep=0.5, scale_factor=1.0, interrupt=0, input_key="x", seed=0)
    lb = LeanBatchCallback(InfoBatch(Dicts(), EPOCHS, prune_ratio=0.6, delta=0.75, seed=11), sb)
    module = make_module(lb)

    def training_step(batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        batch = lb.select(batch, module, batch_idx, loss_fn=module.sb_loss)
        assert torch.equal(batch["index"], batch["x"][:, 0].long())  # kept rows keep their indices
        module.rows.append(batch["index"].tolist())
        return lb.loss(module.per_sample(batch["x"], batch["labels"]), batch["index"])

    module.training_step = training_step
    make_trainer([lb]).fit(module)
    trained = torch.tensor([i for r in module.rows for i in r])
    last = trained[-sum(len(r) for r in module.rows[-15:]) :]  # the last (full) epoch's kept rows
    assert torch.equal(
        lb.infobatch.scores.get(last), identity_loss(torch.stack([last.float()], 1), EPOCHS - 1)
    )


def test_misuse_is_a_clear_error_before_or_at_the_first_batch():
    lb = callback()
    with pytest.raises(ValueError, match=r"num_epochs=4.*max_epochs=3"):
        make_trainer([lb], max_epochs=3).fit(make_module(lb))

    lb = callback()
    module = make_module(lb)
    module.training_step = lambda batch, batch_idx: module.per_sample(batch[0], batch[1]).mean()
    with pytest.raises(RuntimeError, match=r"lb.loss\(\) 0 times"):
        make_trainer([lb]).fit(module)

    lb = callback()
    module = make_module(lb)
    module.train_dataloader = lambda: DataLoader(lb.dataset, batch_size=BS, shuffle=True)
    with pytest.raises(RuntimeError, match="does not draw from lb.sampler"):
        make_trainer([lb]).fit(module)

    lb = callback()
    with pytest.raises(TypeError, match="needs the batch's dataset indices"):
        lb.loss(torch.ones(3))
    with pytest.raises(ValueError, match="drop shuffle="):
        lb.dataloader(batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="infobatch=.*selective_backprop="):
        LeanBatchCallback()
    with pytest.raises(TypeError, match="carry_scores must be True or False"):
        LeanBatchCallback(lb.infobatch, carry_scores=1)


def untrained_remainder_fit(tmp: Path, mode: str, ckpt: Path | None = None) -> tuple[Any, Any, list[float]]:
    """A fit whose epochs leave planned samples untrained: the DataLoader's ``drop_last`` remainder,
    or the batches a fractional ``limit_train_batches`` cuts; a ProgressLR; checkpoints after every
    step and at every epoch's end."""
    lb = callback()
    module = make_module(lb)
    if mode == "drop_last":
        module.train_dataloader = lambda: lb.dataloader(batch_size=BS, drop_last=True)
    lrs: list[float] = []

    def configure_optimizers() -> Any:
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        sched = ProgressLR(opt, lb, cosine())
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    module.configure_optimizers = configure_optimizers
    module.on_train_batch_end = lambda *a: lrs.append(module.optimizers().param_groups[0]["lr"])
    savers = [
        Saver(dirpath=tmp, filename="s{step}", every_n_train_steps=1, save_top_k=-1),
        Saver(dirpath=tmp, filename="end{epoch}", save_on_train_epoch_end=True, save_top_k=-1),
    ]
    limit = {"limit_train_batches": 0.8} if mode == "limit" else {}
    make_trainer([lb, *(savers if ckpt is None else [])], **limit).fit(module, ckpt_path=ckpt)
    return lb, module, lrs


@pytest.mark.parametrize("mode", ["drop_last", "limit"])
def test_resume_at_an_epoch_end_with_untrained_planned_samples_trains_the_next_epoch_whole(tmp_path, mode):
    """Lightning reads the loader's length once at a restart and does not call ``iter()`` again for
    the first resumed epoch: the length it reads must be the next epoch's, not the remainder's."""
    lb, module, lrs = untrained_remainder_fit(tmp_path, mode)
    per_epoch = lengths(module.rows)
    last_of_2 = sum(per_epoch[:3])  # the step checkpoint after the last batch of pruned epoch 2
    for ckpt in (tmp_path / "endepoch=2.ckpt", tmp_path / f"s{last_of_2}.ckpt".replace("s", "sstep=")):
        assert ckpt.exists(), sorted(p.name for p in tmp_path.iterdir())
        lb2, module2, lrs2 = untrained_remainder_fit(tmp_path / "resumed", mode, ckpt)
        assert lengths(module2.rows) == [0, 0, 0, per_epoch[3]], ckpt.name  # the last epoch, whole
        assert module2.rows == module.rows[last_of_2:], ckpt.name
        assert lb2.progress == lb.progress == 1.0 and lrs2[-1] == lrs[-1], ckpt.name
        assert lb2.infobatch.epoch_stats == lb.infobatch.epoch_stats, ckpt.name


def test_fit_from_the_last_checkpoint_of_a_finished_fit_plans_and_trains_nothing(tmp_path):
    """The cluster pattern "always pass the last checkpoint": with worker processes, which pull from
    the sampler as soon as Lightning makes the loader's iterator, no epoch past num_epochs is planned."""
    lb = callback()
    module = make_module(lb, workers=2)
    make_trainer([lb, Saver(dirpath=tmp_path, filename="end{epoch}", save_on_train_epoch_end=True)]).fit(
        module
    )
    last = tmp_path / f"endepoch={EPOCHS - 1}.ckpt"
    lb2 = callback()
    module2 = make_module(lb2, workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # not even the "all epochs are trained" warning
        make_trainer([lb2]).fit(module2, ckpt_path=last)
    assert module2.rows == []
    assert lb2.infobatch.epoch_stats == lb.infobatch.epoch_stats  # no extra epoch planned
    assert lb2.infobatch.position == lb.infobatch.position and lb2.progress == 1.0


@pytest.fixture(scope="module")
def two_process_fit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world")
    run_job("world", str(out), "2")
    return out


def test_a_two_process_fit_ends_on_a_barrier_and_its_infobatch_logs_add_no_collective(two_process_fit):
    """Under gloo a process that exits right after a collective on a tensor made in Python (a
    synced log) can abort ("terminate called without an active exception"): the callback ends a
    distributed fit on a barrier, after every reduce. InfoBatch's logs, the same on every rank, are
    not synced: this job (InfoBatch alone, logging its stats) makes no log-sync at all."""
    for r in range(2):
        events = torch.load(two_process_fit / f"w2-{r}.pt", weights_only=False)["collectives"]
        assert events[-1] == "barrier:leanbatch_train_end"
        assert "reduce" in events and "log-sync" not in events


@pytest.mark.parametrize("devices", [1, 3])
def test_a_two_process_checkpoint_resumes_on_another_number_of_processes(two_process_fit, devices):
    """Saved inside a pruned epoch on 2 DDP processes, resumed on 1 or 3: the same plans, and the
    interrupted epoch trains the samples not trained yet, none twice but the new world's padding."""
    tmp_path = two_process_fit
    full = [torch.load(tmp_path / f"w2-{r}.pt", weights_only=False) for r in range(2)]
    stats = full[0]["stats"]
    epoch = next(e for e, s in enumerate(stats) if s["pruning"] and s["kept"] < 203)
    done = len([r for r in full[0]["rows"] if r[0] < epoch]) + 3  # three batches into it
    run_job("world", str(tmp_path), str(devices), str(tmp_path / "w2" / f"step={done}.ckpt"))
    resumed = [torch.load(tmp_path / f"w{devices}r-{r}.pt", weights_only=False) for r in range(devices)]

    def plans(s: list[dict]) -> list[tuple]:
        return [(x["epoch"], x["kept"], x["pruned"], x["threshold"]) for x in s]

    assert all(plans(r["stats"]) == plans(stats) for r in resumed)
    torch.testing.assert_close(resumed[0]["scores"], full[0]["scores"], equal_nan=True)
    before = [i for r in full for row in r["rows"] if row[0] == epoch and row[1] < 3 for i in row[2]]
    after = [i for r in resumed for row in r["rows"] if row[0] == epoch for i in row[2]]
    kept = stats[epoch]["kept"]
    assert set(before) | set(after) == {
        i for r in full for row in r["rows"] if row[0] == epoch for i in row[2]
    }
    assert len(set(before) | set(after)) == kept and len(before) + len(after) - kept < devices  # padding only
    for e in range(epoch + 1, EPOCHS):
        got = {i for r in resumed for row in r["rows"] if row[0] == e for i in row[2]}
        assert got == {i for r in full for row in r["rows"] if row[0] == e for i in row[2]}
    assert all(r["progress"] == 1.0 for r in resumed)
