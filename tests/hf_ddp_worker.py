"""One process of ``test_hf_distributed.py``: run under ``torchrun --nproc_per_node 2`` (gloo on CPU).

Trains a tiny Llama with InfoBatch and Selective Backprop stacked through the real Trainer
and accelerate, then writes what this process saw to ``<out>/rank<r>.pt``.

``python hf_ddp_worker.py OUT [SAVE_STEPS [RESUME_FROM]] [--fsdp] [--gpu] [--carry] [--packed]``: save a
checkpoint every ``SAVE_STEPS`` steps (0: none), resume from the checkpoint folder ``RESUME_FROM``, carry
the scores in DDP's gradient all-reduce (``carry_scores=True``; else each step's all-gather), ask
accelerate for FSDP (which it ignores on the CPU: its FSDP needs GPUs), train on the GPUs
(``benchmarks/gpu_fsdp.py --hf``), or (``--packed``, no Selective Backprop) train padded then
packed by ``DataCollatorWithFlattening`` in one launch, saving both. The scores are not merged by hand at the end: the trainer
merges them.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def train(out: str, batches: str = "stacked", **options: Any) -> tuple[dict, Any]:
    """One run (``options``: ``main``'s). ``batches``: ``"stacked"``, padded with Selective Backprop
    stacked; ``"padded"`` or ``"packed"`` (by ``DataCollatorWithFlattening``), InfoBatch alone
    (Selective Backprop is refused on packed rows)."""
    save_steps, resume = options.get("save_steps", 0), options.get("resume")
    fsdp, gpu, packed = options.get("fsdp", False), options.get("gpu", False), batches != "stacked"
    carry = options.get("carry", False)
    from hf_setup import PadCollator, Recorder, instruction_data, params, tiny_model, training_args
    from transformers import DataCollatorWithFlattening

    from leanbatch import InfoBatch, SelectiveBackprop

    data = instruction_data(30, seed=3)
    ds = InfoBatch(data, 3, prune_ratio=0.6, delta=0.67, seed=10, shard=False)
    sb = (
        None
        if packed
        else SelectiveBackprop(start=0.3, end=0.9, keep=0.5, scale_factor=1.0, interrupt=2, seed=1)
    )
    saving: dict = {"save_strategy": "steps", "save_steps": save_steps} if save_steps else {}
    if fsdp:
        saving.update(fsdp=True, fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    args = training_args(
        f"{out}/run",
        num_train_epochs=3,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        use_cpu=not gpu,
        **saving,
    )
    collator = DataCollatorWithFlattening() if batches == "packed" else PadCollator()
    trainer = Recorder(
        model=tiny_model(0 if resume is None else 1),  # a resumed run must not depend on its initial weights
        args=args,
        train_dataset=ds,
        data_collator=collator,
        selective_backprop=sb,
        carry_scores=carry,
    )
    trainer.train(resume_from_checkpoint=resume)
    result = {
        "world": trainer.accelerator.num_processes,
        "micro": trainer.micro,
        "plans": trainer.plans,
        "epoch_stats": ds.epoch_stats,
        "scores": ds.scores.values.cpu().clone(),
        "params": params(trainer.model).cpu(),
        "fsdp": trainer.is_fsdp_enabled,
        "wrapper": type(trainer.model_wrapped).__name__,
        "epoch": trainer.state.epoch,
        "global_step": trainer.state.global_step,
        "progress": ds.progress,
        "selected_batches": None if sb is None else sb.stats.selected_batches,
        "carried": None if (c := trainer.score_carrier) is None else (c.carried_rows, c.gathered_rows),
    }
    return result, trainer


def main(
    out: str,
    save_steps: int = 0,
    resume: str | None = None,
    fsdp: bool = False,
    gpu: bool = False,
    carry: bool = False,
    packed: bool = False,
) -> None:
    torch.set_num_threads(1)
    if packed:  # the padded run, then the packed one, in one launch
        padded, trainer = train(out + "/padded", "padded")
        del trainer
        result, trainer = train(out, "packed")
        result["padded"] = padded
    else:
        result, trainer = train(out, save_steps=save_steps, resume=resume, fsdp=fsdp, gpu=gpu, carry=carry)
    torch.save(result, f"{out}/rank{trainer.args.process_index}.pt")
    import gc

    import torch.distributed as dist

    del trainer  # its DDP replica's reducer must go before the group (it aborted the exit otherwise)
    if dist.is_initialized():  # a gloo group left to the interpreter's exit can abort it too
        gc.collect()  # the replicas left in reference cycles, then every rank meets and leaves the group
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--fsdp", "--gpu", "--carry", "--packed")]
    main(
        args[0],
        *(int(a) if a.isdigit() else a for a in args[1:]),  # type: ignore[arg-type]
        fsdp="--fsdp" in sys.argv,
        gpu="--gpu" in sys.argv,
        carry="--carry" in sys.argv,
        packed="--packed" in sys.argv,
    )
