"""leanbatch.hf with real ``Trainer.train`` runs on a tiny Llama (no downloads).

Loss and gradients equal the stock Trainer's when nothing is pruned; scores, weights and
normalisation equal a hand computation; indices never reach the collator or the model;
pruning happens in pruning epochs only; no gradient leaks from a pruned epoch's last
partial accumulation group; the schedule ends at zero and epochs are counted right.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hf_setup import (
    PadCollator,
    Recorder,
    Trace,
    Trainer,
    instruction_data,
    params,
    tiny_model,
    token_sums,
    training_args,
)
from transformers import DataCollatorWithFlattening

from leanbatch import InfoBatch, Plan, ProgressLR, SelectiveBackprop, StreamInfoBatch, cosine
from leanbatch.hf import INDEX_KEY, LeanBatchTrainer, leanbatch_trainer

N = 22  # batches of 4: five full and one of 2 per full epoch


@pytest.mark.parametrize("collator", [PadCollator, DataCollatorWithFlattening])
def test_weights_one_equal_the_stock_trainer(tmp_path, collator):
    """Every sequence kept with weight 1.0 (multiplied in): loss and gradients must be the stock Trainer's,
    on padded batches and on packed ones (``DataCollatorWithFlattening``: the model's own packed loss)."""
    data = instruction_data(N)
    kw = dict(
        num_train_epochs=2, gradient_accumulation_steps=2, lr_scheduler_type="constant", max_grad_norm=0
    )

    def keep_all_weight_one(scores, epoch, generator):
        return Plan(epoch, scores.numel(), None, torch.ones(scores.numel()), None, True)

    ds = InfoBatch(data, 2, seed=3, policy=keep_all_weight_one, shard=False)
    lean_trace = Trace(grads=True)
    lean = Recorder(
        model=tiny_model(),
        args=training_args(str(tmp_path / "lean"), **kw),
        train_dataset=ds,
        data_collator=collator(),
        callbacks=[lean_trace],
    )
    lean.train()
    assert all(w == 1.0 for m in lean.micro for w in m["weights"])
    order = [i for m in lean.micro for i in m["indices"]]  # the leanbatch run's order, fed to the stock run

    class FixedOrder(torch.utils.data.Sampler):
        def __init__(self) -> None:
            self.epoch = 0

        def __iter__(self):
            self.epoch += 1
            return iter(order[(self.epoch - 1) * N : self.epoch * N])

        def __len__(self) -> int:
            return N

    class StockOrdered(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return FixedOrder()

    stock_trace = Trace(grads=True)
    stock = StockOrdered(
        model=tiny_model(),
        args=training_args(str(tmp_path / "stock"), **kw),
        train_dataset=data,
        data_collator=collator(),
        callbacks=[stock_trace],
    )
    stock.train()
    lean_losses = [h["loss"] for h in lean.state.log_history if "loss" in h]
    stock_losses = [h["loss"] for h in stock.state.log_history if "loss" in h]
    assert len(lean_losses) == len(stock_losses) == 6
    torch.testing.assert_close(lean_losses, stock_losses, rtol=1e-6, atol=1e-7)
    assert len(lean_trace.grads) == len(stock_trace.grads) == 6
    for g_lean, g_stock in zip(lean_trace.grads, stock_trace.grads, strict=True):
        torch.testing.assert_close(g_lean, g_stock, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(params(lean.model), params(stock.model), rtol=1e-5, atol=1e-6)
    eval_lean = lean.evaluate(eval_dataset=data)["eval_loss"]  # the loss function also serves evaluation
    eval_stock = stock.evaluate(eval_dataset=data)["eval_loss"]
    assert eval_lean == pytest.approx(eval_stock, rel=1e-6)


def test_scores_weights_and_normalisation_by_hand(tmp_path):
    """learning_rate=0 freezes the model, so every score and every loss can be computed by hand."""
    data = instruction_data(N)
    collator = PadCollator()
    model = tiny_model()
    seen_by_model: set[str] = set()
    model.register_forward_pre_hook(lambda m, a, kw: seen_by_model.update(kw), with_kwargs=True)
    ds = InfoBatch(data, 3, prune_ratio=0.5, delta=0.67, seed=1, shard=False)
    trainer = Recorder(
        model=model,
        args=training_args(
            str(tmp_path), num_train_epochs=3, learning_rate=0.0, gradient_accumulation_steps=2
        ),
        train_dataset=ds,
        data_collator=collator,
    )
    trainer.train()
    # the index never reaches the collator or the model; remove_unused_columns still drops "text"
    assert collator.keys_seen == {"input_ids", "labels"}
    assert INDEX_KEY not in seen_by_model and "input_ids" in seen_by_model
    by_hand = [token_sums(model, ex) for ex in data]
    scores = ds.scores.values
    assert math.isnan(scores[1])  # no labelled token: never scored
    expected = torch.tensor([s / c if c else float("nan") for s, c in by_hand])
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    # pruning epochs only: epoch 0 has no scores, epoch 1 prunes, epoch 2 anneals
    assert [s["pruning"] for s in ds.epoch_stats] == [False, True, False]
    assert [s["kept"] < N for s in ds.epoch_stats] == [False, True, False]
    assert ds.epoch_stats[1]["pruned"] > 0
    for e in range(3):
        trained = [i for m in trainer.micro if m["epoch"] == e for i in m["indices"]]
        assert len(trained) == len(set(trained)) == ds.epoch_stats[e]["kept"]
    assert 1 in [i for m in trainer.micro if m["epoch"] == 1 for i in m["indices"]]  # unscored: never pruned
    weights = {w for m in trainer.micro for w in m["weights"]}
    assert weights == {1.0, 2.0}  # kept below-mean sequences are up-weighted by 1 / (1 - 0.5)
    # each micro-batch's loss: sum of its sequences' weighted token losses / labelled tokens of the group
    groups: dict[tuple[int, int], int] = {}
    for m in trainer.micro:
        key = (m["step"], m["epoch"])
        groups[key] = groups.get(key, 0) + sum(by_hand[i][1] for i in m["indices"])
    for m in trainer.micro:
        assert m["num_items"] == groups[(m["step"], m["epoch"])]  # real tokens only, never padding
        want = (
            sum(w * by_hand[i][0] for i, w in zip(m["indices"], m["weights"], strict=True)) / m["num_items"]
        )
        assert m["loss"] == pytest.approx(want, rel=1e-5)


def test_accumulation_schedule_and_epochs_match_a_hand_reference(tmp_path):
    """SGD, linear decay, gradient_accumulation_steps=2, a pruned epoch with an odd number of batches.

    The reference steps the optimizer after every 2 micro-batches of an epoch and after its
    last one, at ``lr * (1 - progress)`` (progress = (epoch + fraction of it trained) /
    epochs); a gradient left over from a pruned epoch's last partial group (what the stock
    loop does) or a schedule fixed in steps would not match.
    """
    data = instruction_data(26)
    ga, lr, epochs = 2, 0.05, 3
    init = tiny_model()
    ds = InfoBatch(data, epochs, prune_ratio=0.9, delta=0.67, seed=1, shard=False)
    trace = Trace()
    trainer = Recorder(
        model=copy.deepcopy(init),
        args=training_args(
            str(tmp_path),
            num_train_epochs=epochs,
            gradient_accumulation_steps=ga,
            optim="sgd",
            learning_rate=lr,
            lr_scheduler_type="linear",
            max_grad_norm=0,
        ),
        train_dataset=ds,
        data_collator=PadCollator(),
        callbacks=[trace],
    )
    trainer.train()
    batches = [sum(m["epoch"] == e for m in trainer.micro) for e in range(epochs)]
    assert batches[0] == 7 and batches[1] % ga == 1  # the pruned epoch ends with a lone micro-batch
    groups = [-(-b // ga) for b in batches]
    assert trainer.state.global_step == sum(groups) < trainer.state.max_steps == 3 * 4
    assert trace.epochs == [1.0, 2.0, 3.0] and trainer.state.epoch == 3.0
    assert trainer.lr_scheduler.get_last_lr()[0] == 0.0

    model, collate = copy.deepcopy(init), PadCollator()
    lrs = []
    for e in range(epochs):
        mbs = [m for m in trainer.micro if m["epoch"] == e]
        done = 0
        for g in range(0, len(mbs), ga):
            group = mbs[g : g + ga]
            batches_g = [collate([data[i] for i in m["indices"]]) for m in group]
            items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches_g)
            model.zero_grad()
            for m, b in zip(group, batches_g, strict=True):
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                tok = torch.nn.functional.cross_entropy(
                    logits[:, :-1].transpose(1, 2), b["labels"][:, 1:], ignore_index=-100, reduction="none"
                )
                (tok.sum(1) * torch.tensor(m["weights"])).sum().div(items).backward()
            lrs.append(lr * (1 - (e + done / ds.epoch_stats[e]["kept"]) / epochs))
            with torch.no_grad():
                for p in model.parameters():
                    p -= lrs[-1] * p.grad
            done += sum(len(m["indices"]) for m in group)
        assert done == ds.epoch_stats[e]["kept"]
    torch.testing.assert_close(trace.lrs, lrs, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(params(trainer.model), params(model), rtol=1e-4, atol=1e-6)


def test_random_pruning_and_selective_backprop(tmp_path):
    """Random pruning prunes; Selective Backprop trains whole sequences and counts only their tokens.

    Two loader workers read batches ahead of training (prefetch), which the ledger absorbs.
    """
    data = instruction_data(N)
    ds = InfoBatch(data, 3, prune_ratio=0.5, delta=0.67, seed=2, policy="random", shard=False)
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=2, seed=4)
    trainer = Recorder(
        model=tiny_model(),
        args=training_args(
            str(tmp_path), num_train_epochs=3, gradient_accumulation_steps=2, dataloader_num_workers=2
        ),
        train_dataset=ds,
        data_collator=PadCollator(),
        selective_backprop=sb,
    )
    trainer.train()
    assert ds.epoch_stats[1]["pruning"] and ds.epoch_stats[1]["kept"] < N
    selected = [m for m in trainer.micro if len(m["kept"]) < len(m["indices"])]
    assert selected and sb.stats.selected_batches == len(selected)
    assert all(len(m["kept"]) == len(m["indices"]) // 2 for m in selected)  # keep=0.5, whole sequences
    group_items: dict[int, int] = {}
    for m in trainer.micro:
        group_items[m["step"]] = group_items.get(m["step"], 0) + m["labels_kept"]
    assert all(m["num_items"] == group_items[m["step"]] for m in trainer.micro)
    assert trainer.state.epoch == 3.0 and ds.progress == 1.0
    for e in range(3):  # every epoch trained exactly its plan, whatever the workers read ahead
        trained = sorted(i for m in trainer.micro if m["epoch"] == e for i in m["indices"])
        kept, _ = trainer.plans[e]
        assert trained == (list(range(N)) if kept is None else sorted(kept))


def _refusal(tmp_path, match, args=None, **kw):
    data = instruction_data(8)
    kw.setdefault("train_dataset", InfoBatch(data, 2, shard=False))
    with pytest.raises((ValueError, TypeError), match=match):
        LeanBatchTrainer(
            model=tiny_model(), args=args or training_args(str(tmp_path), num_train_epochs=2), **kw
        )


def test_misconfigurations_are_refused_with_the_fix(tmp_path):
    data = instruction_data(8)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stream = StreamInfoBatch(lambda: ({"id": i, **d} for i, d in enumerate(data)), 2, key="id")
    steps = training_args(str(tmp_path), max_steps=4)
    refusals = [
        (r"shard=False", {"train_dataset": InfoBatch(data, 2)}),
        (
            r"num_train_epochs=3 but InfoBatch\(num_epochs=2\)",
            {"args": training_args(str(tmp_path), num_train_epochs=3)},
        ),
        (r"max_steps=5", {"args": training_args(str(tmp_path), num_train_epochs=2, max_steps=5)}),
        (r"drop compute_loss_func", {"compute_loss_func": lambda out, labels, num_items_in_batch=None: 0}),
        (
            r"label_smoothing_factor=0\.1",
            {"args": training_args(str(tmp_path), num_train_epochs=2, label_smoothing_factor=0.1)},
        ),
        (
            r"train_sampling_strategy='group_by_length'",
            {
                "args": training_args(
                    str(tmp_path), num_train_epochs=2, train_sampling_strategy="group_by_length"
                )
            },
        ),
        (r"optimizers=\(optimizer, None\)", {"optimizers": (opt, sched)}),
        (r"scale_factor=1\.0", {"selective_backprop": SelectiveBackprop(scale_factor=0.5)}),
        (
            r"staleness=1",
            {"selective_backprop": SelectiveBackprop(scale_factor=1.0, staleness=2, num_samples=8)},
        ),
        (r"must be a leanbatch.SelectiveBackprop", {"selective_backprop": "sb"}),
        (r"carry_scores must be True or False", {"carry_scores": "yes"}),
        (r"nothing to do", {"train_dataset": data}),
        (r"sets num_epochs itself", {"train_dataset": data, "infobatch": {"num_epochs": 2}}),
        (r"not both", {"infobatch": {"prune_ratio": 0.5}}),
        (r"dict of InfoBatch settings", {"train_dataset": data, "infobatch": 0.5}),
        (
            r"train_dataset: a StreamInfoBatch",
            {"train_dataset": stream, "args": steps},
        ),  # a stream needs them
        (r"train_dataset: a StreamInfoBatch", {"train_dataset": stream.dataset, "args": steps}),
    ]
    for match, kw in refusals:
        _refusal(tmp_path, match, **kw)
    with pytest.raises(TypeError, match="subclass of it"):
        leanbatch_trainer(torch.nn.Module)


def test_a_trainer_subclass_keeps_its_own_compute_loss(tmp_path):
    """leanbatch_trainer(cls) wraps a subclass whose compute_loss calls super() (as trl's trainers do)."""
    calls = []

    class Counting(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            calls.append(sorted(inputs))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trainer = leanbatch_trainer(Counting)(  # infobatch={...}: wraps the dataset the trainer prepared
        model=tiny_model(),
        args=training_args(str(tmp_path), num_train_epochs=2),
        train_dataset=instruction_data(N),
        data_collator=PadCollator(),
        infobatch={"prune_ratio": 0.5, "delta": 1.0, "seed": 0},
    )
    ds = trainer.infobatch
    assert ds is trainer.train_dataset and ds.num_epochs == 2 and not ds.sampler.shard
    trainer.train()
    assert calls and all(c == ["attention_mask", "input_ids", "labels"] for c in calls)
    assert ds.scores.num_scored() == N - 1 and trainer.state.epoch == 2.0


def test_a_progress_lr_passed_in_trains_and_checkpoints(tmp_path):
    """optimizers=(opt, ProgressLR(...)) is accepted, ends at zero and goes into a Trainer checkpoint."""
    model = tiny_model()
    ds = InfoBatch(instruction_data(N), 2, prune_ratio=0.5, delta=1.0, seed=0, shard=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = LeanBatchTrainer(
        model=model,
        args=training_args(str(tmp_path), num_train_epochs=2, save_strategy="epoch"),
        train_dataset=ds,
        data_collator=PadCollator(),
        optimizers=(opt, ProgressLR(opt, ds, cosine())),
    )
    trainer.train()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    step = trainer.state.global_step
    assert (
        torch.load(tmp_path / f"checkpoint-{step}" / "scheduler.pt", weights_only=True)["last_epoch"] == step
    )


def test_a_subclass_whose_compute_loss_skips_leanbatch_is_an_error_at_the_first_step(tmp_path):
    """A ``compute_loss`` that returns the model's own loss never reaches leanbatch's: nothing would be
    scored, every sample kept, and the run would look like InfoBatch while being the baseline."""

    class OwnLoss(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    trainer = leanbatch_trainer(OwnLoss)(
        model=tiny_model(),
        args=training_args(str(tmp_path), num_train_epochs=2),
        train_dataset=instruction_data(N),
        data_collator=PadCollator(),
        infobatch={"prune_ratio": 0.5, "delta": 1.0, "seed": 0},
    )
    with pytest.raises(RuntimeError, match=r"compute_loss did not go through leanbatch's loss"):
        trainer.train()
    assert trainer.state.global_step == 0 and trainer.infobatch.position.trained == 0
