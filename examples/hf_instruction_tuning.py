"""Instruction tuning with the Hugging Face Trainer: baseline vs InfoBatch, on CPU, in about a minute.

A tiny Llama (built from a config, nothing downloaded) learns two generated tasks. The
prompt (labelled -100, so it is never trained on) is a few random tokens and a task token:

- *easy*: answer with the same four tokens whatever the prompt - learned in a few steps;
- *hard*: answer with three tokens looked up in fixed random tables from the prompt's first
  and last words - learned slowly (the tables must be memorised, entry by entry).

All runs use the same model initialisation, data and schedule (AdamW, cosine with warm-up
to zero at the end of training). InfoBatch skips well-learned sequences in the pruning
epochs (the easy ones, mostly) and up-weights the rest of the below-mean ones so the
expected gradient is unchanged; the last epoch trains on everything. The third run is the
bar InfoBatch must clear: the baseline trained on as many sequences as InfoBatch trained
(fewer epochs, its schedule decayed to its own end). Printed per run: sequences trained and
skipped, training wall-clock (and CPU time), and the loss on a held-out set of both tasks.

    python examples/hf_instruction_tuning.py                 # one seed
    python examples/hf_instruction_tuning.py --seeds 0,1,2   # the README's table
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from leanbatch import InfoBatch
from leanbatch.hf import LeanBatchTrainer

VOCAB, PAD, BOS, SEP, EOS, EASY, HARD = 64, 0, 1, 2, 3, 4, 5
EASY_ANSWER = [6, 7, 8, 9]
N_TRAIN, N_EVAL, EPOCHS, BATCH = 3000, 400, 6, 32
WORDS = range(10, VOCAB)
_table = random.Random(1234)  # the hard task's lookup tables: part of the task, the same for every seed
TABLES = [{w: _table.randrange(10, VOCAB) for w in WORDS} for _ in range(3)]


def make_example(rng: random.Random) -> dict[str, list[int]]:
    """One instruction: prompt (labelled -100) then the answer and EOS (labelled)."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 10))]
    hard = rng.random() < 1 / 3
    prompt = [BOS, *words, HARD if hard else EASY, SEP]
    lookup = [TABLES[0][words[0]], TABLES[1][words[0]], TABLES[2][words[-1]]]
    answer = (lookup if hard else EASY_ANSWER) + [EOS]
    return {"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}


def collate(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence: PAD ids, attention mask 0, labels -100."""
    width = max(len(f["input_ids"]) for f in features)
    batch = {
        "input_ids": torch.full((len(features), width), PAD),
        "attention_mask": torch.zeros((len(features), width), dtype=torch.long),
        "labels": torch.full((len(features), width), -100),
    }
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        batch["input_ids"][row, :n] = torch.tensor(f["input_ids"])
        batch["attention_mask"][row, :n] = 1
        batch["labels"][row, :n] = torch.tensor(f["labels"])
    return batch


def tiny_llama(seed: int) -> LlamaForCausalLM:
    """2 layers, width 128: about 0.4M parameters."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(config)


def run(method: str, seed: int, train: list, evaluation: list, out: str, epochs: float) -> dict[str, float]:
    args = TrainingArguments(
        output_dir=out,
        num_train_epochs=epochs,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=200,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=20,
        seed=seed,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    common = dict(model=tiny_llama(seed), args=args, data_collator=collate, eval_dataset=evaluation)
    if method != "infobatch":
        trainer: Trainer = Trainer(train_dataset=train, **common)
    else:  # the three lines a user adds: wrap the data, keep shard=False, use LeanBatchTrainer
        ds = InfoBatch(train, num_epochs=EPOCHS, prune_ratio=0.5, delta=0.875, seed=seed, shard=False)
        trainer = LeanBatchTrainer(train_dataset=ds, **common)
    start, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    skipped = trainer.infobatch.get_pruned_count() if method == "infobatch" else 0
    return {
        "trained": round(epochs * len(train)) - skipped,
        "skipped": skipped,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "eval_loss": trainer.evaluate()["eval_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see below)")
    opts = parser.parse_args()
    # A model this small gains nothing from a second thread, and on a shared machine two threads
    # per process wait on each other: one thread keeps the timings of the two runs comparable.
    torch.set_num_threads(opts.threads)
    seeds = [int(s) for s in opts.seeds.split(",")]
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "infobatch": [], "equal-work": []}
    with tempfile.TemporaryDirectory() as out:
        for seed in seeds:
            rng = random.Random(seed)
            train = [make_example(rng) for _ in range(N_TRAIN)]
            evaluation = [make_example(rng) for _ in range(N_EVAL)]
            epochs: float = EPOCHS
            for method in results:  # same seed, same data, one after the other
                if method == "equal-work":  # the baseline, trained on as many sequences as InfoBatch
                    epochs = results["infobatch"][-1]["trained"] / N_TRAIN
                r = run(method, seed, train, evaluation, out, epochs)
                results[method].append(r)
                print(
                    f"seed {seed} {method:10s}: trained {r['trained']:6d} sequences, skipped {r['skipped']:5d}, "
                    f"{r['seconds']:6.1f} s ({r['cpu_seconds']:.1f} s CPU), eval loss {r['eval_loss']:.4f}",
                    flush=True,
                )
    base, info, short = results["baseline"], results["infobatch"], results["equal-work"]
    saved = [1 - i["seconds"] / b["seconds"] for b, i in zip(base, info, strict=True)]
    saved_cpu = [1 - i["cpu_seconds"] / b["cpu_seconds"] for b, i in zip(base, info, strict=True)]

    def mean_sd(xs: list[float]) -> str:
        return f"{statistics.mean(xs):.4f}" + (f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else "")

    print(f"\n{len(seeds)} seed(s), {EPOCHS} epochs of {N_TRAIN} sequences")
    for name, rs in results.items():
        print(f"{name:10s} eval loss {mean_sd([r['eval_loss'] for r in rs])}")
    skipped = statistics.mean(r["skipped"] for r in info) / (EPOCHS * N_TRAIN)
    print(f"infobatch skipped {skipped:.1%} of the sequence passes")
    print(f"infobatch saved {mean_sd(saved)} of the wall-clock, {mean_sd(saved_cpu)} of the CPU time")
    saved_short = [1 - s["seconds"] / b["seconds"] for b, s in zip(base, short, strict=True)]
    print(f"equal-work saved {mean_sd(saved_short)} of the wall-clock")


if __name__ == "__main__":
    main()
