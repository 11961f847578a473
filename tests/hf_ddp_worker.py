"""One process of ``test_hf_distributed.py``: run under ``torchrun --nproc_per_node 2`` (gloo on CPU).

Trains a tiny Llama with InfoBatch and Selective Backprop stacked through the real Trainer
and accelerate, then writes what this process saw to ``<out>/rank<r>.pt``.
"""

from __future__ import annotations

import sys

import torch


def main(out: str) -> None:
    torch.set_num_threads(1)
    from hf_setup import PadCollator, Recorder, instruction_data, params, tiny_model, training_args

    from leanbatch import InfoBatch, SelectiveBackprop

    data = instruction_data(30, seed=3)
    ds = InfoBatch(data, 3, prune_ratio=0.6, delta=0.67, seed=7, shard=False)
    sb = SelectiveBackprop(start=0.3, end=0.9, keep=0.5, scale_factor=1.0, interrupt=2, seed=1)
    args = training_args(f"{out}/run", num_train_epochs=3, gradient_accumulation_steps=2, learning_rate=1e-2)
    trainer = Recorder(
        model=tiny_model(0),
        args=args,
        train_dataset=ds,
        data_collator=PadCollator(),
        selective_backprop=sb,
    )
    trainer.train()
    ds.scores.sync()  # planning merges the scores; the last epoch's are merged here
    result = {
        "world": trainer.accelerator.num_processes,
        "micro": trainer.micro,
        "plans": trainer.plans,
        "epoch_stats": ds.epoch_stats,
        "scores": ds.scores.values.clone(),
        "params": params(trainer.model),
        "epoch": trainer.state.epoch,
        "global_step": trainer.state.global_step,
        "progress": ds.progress,
        "selected_batches": sb.stats.selected_batches,
    }
    torch.save(result, f"{out}/rank{trainer.args.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
