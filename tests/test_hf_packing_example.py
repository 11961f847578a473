"""examples/hf_packing.py, run end to end on a small built-in text (no shared data): the Trainer
trains padding-free packed rows, InfoBatch prunes, and a missing text is one clear error."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import hf_packing  # noqa: E402

from leanbatch.hf import INDEX_KEY  # noqa: E402

NAMES = ("ROMEO", "JULIET", "NURSE", "FRIAR")
LINES = ("what light through yonder window breaks", "a plague on both your houses", "good night",
         "these violent delights have violent ends", "parting is such sweet sorrow")  # fmt: skip
TEXT = "\n\n".join(
    f"{NAMES[i % 4]}:\n" + "\n".join(LINES[(i + j) % 5] for j in range(1 + i % 3)) for i in range(40)
)
ARGS = ["--train-speeches", "24", "--eval-speeches", "4", "--max-chars", "48", "--batch-size", "4"]


def test_the_example_trains_packed_rows_and_infobatch_prunes(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    opts = ["--text", str(path), *ARGS]
    results = hf_packing.main(opts)
    vocab = len(set(TEXT)) + 2
    for r in results.values():  # both learn: below the uniform guess over the characters
        assert r["eval_loss"] < 0.9 * math.log(vocab)
    assert results["baseline"] == {**results["baseline"], "trained": 72, "skipped": 0}
    info = results["infobatch"]
    assert info["skipped"] > 0 and info["trained"] == 72 - info["skipped"]
    # what the InfoBatch run trains: each batch one row of its speeches, position ids restarting
    parsed = hf_packing.options(opts)
    train, evaluation, vocab = hf_packing.corpus(TEXT, parsed)
    trainer = hf_packing.run("infobatch", train, evaluation, vocab, parsed, str(tmp_path / "out"))
    batch = next(iter(trainer.get_train_dataloader()))
    served = batch[INDEX_KEY].indices.tolist()
    assert batch["input_ids"].shape == (1, sum(len(train[i]["input_ids"]) for i in served))
    assert "attention_mask" not in batch and len(served) == 4 and int((batch["position_ids"] == 0).sum()) == 4


def test_a_missing_text_names_the_argument_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANBATCH_TEXT", str(tmp_path / "absent.txt"))
    with pytest.raises(SystemExit, match=r"no text at .*absent.txt: pass --text PATH or set LEANBATCH_TEXT"):
        hf_packing.main(ARGS)
