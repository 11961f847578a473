"""The Hugging Face Trainer with packing: InfoBatch on padding-free batches of Tiny Shakespeare.

Each sample is one speech of the plays (the text between blank lines, cut to ``--max-chars``
characters), as character ids: speeches have very different lengths, which is what packing is
for. ``DataCollatorWithFlattening`` packs each batch's speeches into one row, told apart by
position ids that restart at 0, so no padding token is computed. A tiny Llama (built from a
config, nothing downloaded) learns them with the stock ``Trainer`` (the baseline) and with
leanbatch's ``LeanBatchTrainer`` and ``InfoBatch``: the sampler serves the plan, the collator packs
what was served, and each packed speech is scored and weighted as it would be padded. Printed per
run: speeches trained and skipped, characters trained, seconds, and the loss on the speeches of
the last 10% of the text::

    python examples/hf_packing.py                                    # a few steps (a minute or two)
    python examples/hf_packing.py --train-speeches 6000 --epochs 6   # longer

The text is ``--text``, else ``$LEANBATCH_TEXT``, else ``../shared/data/tinyshakespeare.txt``
beside the checkout (any UTF-8 text whose paragraphs are separated by blank lines works).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    DataCollatorWithFlattening,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
    set_seed,
)

from leanbatch import InfoBatch
from leanbatch.hf import LeanBatchTrainer

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
BOS = 1  # 0 is padding (never used: the batches are packed); characters start at 2


def read_text(path: str | None) -> str:
    """The corpus: ``path``, else ``$LEANBATCH_TEXT``, else Tiny Shakespeare beside the checkout."""
    where = Path(path or os.environ.get("LEANBATCH_TEXT") or DEFAULT_TEXT)
    if not where.is_file():
        raise SystemExit(
            f"no text at {where}: pass --text PATH or set LEANBATCH_TEXT to a UTF-8 text file "
            "(Tiny Shakespeare is ../shared/data/tinyshakespeare.txt beside the checkout)"
        )
    return where.read_text(encoding="utf-8")


def speeches(text: str, vocab: dict[str, int], max_chars: int, limit: int) -> list[dict[str, list[int]]]:
    """At most ``limit`` speeches (paragraphs), each ``BOS`` and its first ``max_chars`` characters."""
    out = []
    for part in text.split("\n\n"):
        if part.strip() and len(out) < limit:
            ids = [BOS] + [vocab[c] for c in part.strip()[:max_chars]]
            out.append({"input_ids": ids, "labels": ids})
    return out


def corpus(text: str, opts: argparse.Namespace) -> tuple[list[dict], list[dict], int]:
    """Train speeches from the first 90% of the text, eval speeches from the last 10%, and the vocabulary size."""
    vocab = {c: i + 2 for i, c in enumerate(sorted(set(text)))}
    cut = int(0.9 * len(text))
    train = speeches(text[:cut], vocab, opts.max_chars, opts.train_speeches)
    evaluation = speeches(text[cut:], vocab, opts.max_chars, opts.eval_speeches)
    if len(train) < opts.batch_size or not evaluation:
        raise SystemExit(
            f"the text gives {len(train)} training and {len(evaluation)} eval speeches (paragraphs separated "
            f"by blank lines): --text needs at least --batch-size={opts.batch_size} in its first 90% and one after"
        )
    return train, evaluation, len(vocab) + 2


def tiny_llama(vocab: int, max_chars: int, seed: int) -> LlamaForCausalLM:
    """2 layers, width 64: about 0.1M parameters."""
    set_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_chars + 1,
                         pad_token_id=0, bos_token_id=BOS, use_cache=False)  # fmt: skip
    return LlamaForCausalLM(config)


def run(method: str, train: list, evaluation: list, vocab: int, opts: argparse.Namespace, out: str) -> Any:
    """Train one run (``baseline`` or ``infobatch``) on packed batches; the trainer, trained."""
    args = TrainingArguments(output_dir=out, num_train_epochs=opts.epochs, per_device_train_batch_size=opts.batch_size,
                             per_device_eval_batch_size=opts.batch_size, learning_rate=3e-3, lr_scheduler_type="cosine",
                             seed=opts.seed, use_cpu=True, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)  # fmt: skip
    common = dict(model=tiny_llama(vocab, opts.max_chars, opts.seed), args=args, eval_dataset=evaluation,
                  data_collator=DataCollatorWithFlattening())  # fmt: skip
    if method == "baseline":
        return Trainer(train_dataset=train, **common)
    # the lines a user adds: wrap the data (shard=False), use LeanBatchTrainer; the collator is unchanged
    ds = InfoBatch(train, num_epochs=opts.epochs, prune_ratio=0.5, delta=0.875, seed=opts.seed, shard=False)
    return LeanBatchTrainer(train_dataset=ds, **common)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options (``argv``: the arguments, default ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", help="a UTF-8 text (default: $LEANBATCH_TEXT, else Tiny Shakespeare)")
    parser.add_argument("--train-speeches", type=int, default=400, help="training samples (default 400)")
    parser.add_argument("--eval-speeches", type=int, default=200, help="eval samples (default 200)")
    parser.add_argument("--max-chars", type=int, default=128, help="characters kept of each speech (128)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3: InfoBatch prunes the 2nd)")
    parser.add_argument("--batch-size", type=int, default=16, help="speeches packed into each row (16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Train the baseline and InfoBatch on packed batches; print and return what each trained."""
    opts = options(argv)
    torch.set_num_threads(opts.threads)
    train, evaluation, vocab = corpus(read_text(opts.text), opts)
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for method in ("baseline", "infobatch"):
            trainer = run(method, train, evaluation, vocab, opts, out)
            start = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - start
            skipped = trainer.infobatch.get_pruned_count() if method == "infobatch" else 0
            results[method] = {
                "trained": opts.epochs * len(train) - skipped,
                "skipped": skipped,
                "seconds": seconds,
                "eval_loss": trainer.evaluate()["eval_loss"],
            }
    print(f"{len(train)} training speeches ({sum(len(s['input_ids']) for s in train)} characters), "
          f"{len(evaluation)} eval speeches, {opts.epochs} epochs, {opts.batch_size} speeches packed per row")  # fmt: skip
    for method, r in results.items():
        print(f"{method:10s} trained {r['trained']:6d} skipped {r['skipped']:5d} "
              f"{r['seconds']:6.1f} s  eval loss {r['eval_loss']:.4f}")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
