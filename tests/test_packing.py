"""Packed and padding-free batches: one loss per packed sequence, equal to the same sequences unpacked.

The acceptance test runs a real Hugging Face causal LM (a tiny Llama built from a config, float32,
nothing downloaded) on the batches Hugging Face's ``DataCollatorWithFlattening`` and TRL's
padding-free collator make, and compares each packed sequence's loss with the loss of the same
sequence in an ordinary padded batch.
"""

from __future__ import annotations

import pytest
import torch
from hf_setup import PadCollator, instruction_data, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithFlattening
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from leanbatch import packed_sequence_ids, per_sequence_loss
from leanbatch.losses import segment_losses

N = 7  # sequences per batch: prompts masked, one response empty (example 1: no labelled token)


def features() -> list[dict]:
    return [{"input_ids": f["input_ids"], "labels": f["labels"]} for f in instruction_data(N, seed=3)]


def unpacked_losses(model, feats) -> torch.Tensor:
    batch = PadCollator()(feats)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return per_sequence_loss(logits, batch["labels"], shift=True)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    m = tiny_model(seed=1).eval()
    m.config._attn_implementation = request.param
    # What the Trainer does (config.use_cache = args.use_cache, False) and TRL too: with a cache the
    # sdpa and eager masks do not look for packed sequences, and every token attends across them.
    m.config.use_cache = False
    return m


@torch.no_grad()
def test_packed_losses_equal_unpacked_with_a_real_llama(model) -> None:
    """DataCollatorWithFlattening: position ids restart per sequence, the first label of each is -100."""
    feats = features()
    packed = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(feats)
    assert packed["input_ids"].shape[0] == 1  # one row, N sequences
    logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
    want = unpacked_losses(model, feats)
    assert want[1] == 0 and (want[[0, 2, 3]] > 0).all()  # the empty response: 0, as unpacked
    by_position = per_sequence_loss(logits, packed["labels"], shift=True, position_ids=packed["position_ids"])
    by_cu = per_sequence_loss(
        logits, packed["labels"], shift=True, cu_seq_lens=packed["cu_seq_lens_q"], num_sequences=N
    )
    assert by_position.shape == by_cu.shape == (N,)
    torch.testing.assert_close(by_position, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(by_cu, want, atol=1e-5, rtol=0)
    # The model's own loss on the packed row is the token-weighted mean of the sequences' losses.
    own = model(**{k: packed[k] for k in ("input_ids", "position_ids", "labels")}).loss
    counts = torch.tensor([sum(x != -100 for x in f["labels"][1:]) for f in feats], dtype=torch.float64)
    torch.testing.assert_close(float((by_position.double() * counts).sum() / counts.sum()), float(own))
    # What the collator says each token belongs to is what we say.
    ids = packed_sequence_ids(packed["labels"], position_ids=packed["position_ids"])
    assert torch.equal(ids, packed["seq_idx"].long())
    # The row read as one sequence (no position ids) is not what the sequences give.
    whole = per_sequence_loss(logits, packed["labels"], shift=True)
    assert abs(float(whole) - float(want.mean())) > 1e-3


@torch.no_grad()
def test_trl_padding_free_batches_with_trailing_padding(model) -> None:
    """TRL's padding-free collator pads the row on the right (position id 0, label -100): with
    num_sequences the padding is no sequence; without it, each padding token is one, with loss 0."""
    feats = features()
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=64)
    packed = collate(feats)
    total = sum(len(f["input_ids"]) for f in feats)
    pad = packed["input_ids"].shape[1] - total
    assert pad > 1  # the test needs trailing padding
    logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
    want = unpacked_losses(model, feats)
    got = per_sequence_loss(
        logits,
        packed["labels"],
        shift=True,
        position_ids=packed["position_ids"],
        cu_seq_lens=packed["cu_seq_lens_q"],
        num_sequences=N,
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    every = per_sequence_loss(logits, packed["labels"], shift=True, position_ids=packed["position_ids"])
    assert every.shape == (N + pad,) and torch.equal(every[N:], torch.zeros(pad))
    torch.testing.assert_close(every[:N], want, atol=1e-5, rtol=0)
    ids = packed_sequence_ids(packed["labels"], position_ids=packed["position_ids"], num_sequences=N)
    assert ids[0, -pad:].eq(N).all() and ids[0, :total].max() == N - 1


@torch.no_grad()
def test_several_packed_rows(model) -> None:
    """Two rows, each packing sequences of its own (BFD packing without flattening the rows)."""
    g = torch.Generator().manual_seed(0)
    lengths = [[5, 7], [4, 3, 5]]
    seqs = [[torch.randint(10, 96, (k,), generator=g) for k in row] for row in lengths]
    input_ids = torch.stack([torch.cat(row) for row in seqs])
    position_ids = torch.stack([torch.cat([torch.arange(len(s)) for s in row]) for row in seqs])
    labels = input_ids.clone()
    labels[position_ids == 0] = -100
    logits = model(input_ids=input_ids, position_ids=position_ids).logits
    flat = [{"input_ids": s.tolist(), "labels": s.tolist()} for row in seqs for s in row]
    want = unpacked_losses(model, flat)
    got = per_sequence_loss(logits, labels, shift=True, position_ids=position_ids, num_sequences=5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    cu = torch.tensor([0, 5, 12, 16, 19, 24], dtype=torch.int32)
    torch.testing.assert_close(
        per_sequence_loss(logits, labels, shift=True, cu_seq_lens=cu), want, atol=1e-5, rtol=0
    )


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    masked=st.lists(st.booleans(), min_size=54, max_size=54),
    shift=st.booleans(),
    use_cu=st.booleans(),
)
def test_any_packing_gives_the_unpacked_losses(lengths, masked, shift, use_cu) -> None:
    """The same token logits laid out packed and padded give the same per-sequence losses."""
    g = torch.Generator().manual_seed(len(lengths))
    logits = [torch.randn(k, 11, generator=g) for k in lengths]
    labels = [torch.randint(0, 11, (k,), generator=g) for k in lengths]
    pos, start = 0, []
    for seq in labels:  # some tokens unlabelled (prompts); the first of each always, for the shift
        for t in range(len(seq)):
            if masked[pos % len(masked)] or t == 0:
                seq[t] = -100
            pos += 1
    width = max(lengths)
    padded_logits = torch.zeros(len(lengths), width, 11)
    padded_labels = torch.full((len(lengths), width), -100)
    for r, (lg, lb) in enumerate(zip(logits, labels, strict=True)):
        padded_logits[r, : len(lb)], padded_labels[r, : len(lb)] = lg, lb
        start.append(sum(lengths[:r]))
    want = per_sequence_loss(padded_logits, padded_labels, shift=shift)
    packed_logits, packed_labels = torch.cat(logits)[None], torch.cat(labels)[None]
    if use_cu:
        cu = torch.tensor([*start, sum(lengths)], dtype=torch.int32)
        got = per_sequence_loss(packed_logits, packed_labels, shift=shift, cu_seq_lens=cu)
    else:
        position_ids = torch.cat([torch.arange(k) for k in lengths])[None]
        got = per_sequence_loss(packed_logits, packed_labels, shift=shift, position_ids=position_ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_segment_losses_count_labelled_tokens() -> None:
    tok = torch.tensor([[0.5, 1.5, 0.0, 4.0, 0.0]])
    labelled = torch.tensor([[True, True, False, True, False]])
    loss, n = segment_losses(tok, labelled, torch.tensor([[0, 0, 1, 1, 2]]), 3)
    assert loss.tolist() == [1.0, 4.0, 0.0] and n.tolist() == [2, 1, 0]


# ---------------------------------------------------------------------------- bad input
POS = torch.tensor([[0, 1, 2, 0, 1]])
LABELS = torch.tensor([[-100, 3, 4, -100, 5]])
LOGITS = torch.zeros(1, 5, 7)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"num_sequences": 2}, ValueError, "needs them to tell its sequences apart"),
        (
            {"position_ids": torch.tensor([[1, 1, 0, 1, 2]])},
            ValueError,
            "position_ids: every packed sequence",
        ),
        ({"position_ids": POS[:, :4]}, ValueError, r"position_ids must have shape \(1, 5\)"),
        ({"position_ids": POS.float()}, TypeError, "position_ids must be an integer tensor"),
        (
            {"cu_seq_lens": torch.tensor([0, 3, 4])},
            ValueError,
            "cu_seq_lens must run from 0 to the batch's 5",
        ),
        ({"cu_seq_lens": torch.tensor([0, 3, 3, 5])}, ValueError, "strictly"),
        ({"cu_seq_lens": torch.tensor([0.0, 5.0])}, TypeError, "cu_seq_lens must be a 1-D integer"),
        ({"cu_seq_lens": torch.tensor([0, 2, 5]), "position_ids": POS}, ValueError, "disagree"),
        ({"cu_seq_lens": torch.tensor([0, 3, 5]), "num_sequences": 3}, ValueError, "holds 2 sequence"),
        ({"position_ids": POS, "num_sequences": 3}, ValueError, "start fewer sequences"),
        ({"position_ids": POS, "num_sequences": 1}, ValueError, "labelled tokens after its 1-th"),
        ({"position_ids": POS, "num_sequences": 0}, ValueError, "num_sequences must be an int >= 1"),
    ],
)
def test_bad_packing_is_refused_naming_the_argument(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        per_sequence_loss(LOGITS, LABELS, shift=True, **kwargs)


def test_a_label_crossing_into_the_next_sequence_is_refused() -> None:
    """Without the separator, the first sequence's last token would learn the next one's first."""
    labels = torch.tensor([[-100, 3, 4, 6, 5]])
    with pytest.raises(ValueError, match="labels: a packed sequence starts with a label"):
        per_sequence_loss(LOGITS, labels, shift=True, position_ids=POS)
    per_sequence_loss(LOGITS, labels, shift=False, position_ids=POS)  # unshifted: nothing crosses


@torch.no_grad()
def test_trl_bfd_packed_rows_flattened(model) -> None:
    """TRL's BFD packing: each example is a row of several sequences with their ``seq_lengths``;
    the padding-free collator flattens the rows, position ids restarting at every sequence."""
    feats = features()
    rows = [feats[:3], feats[3:5], feats[5:]]
    packed_rows = [
        {
            "input_ids": sum((f["input_ids"] for f in row), []),
            "labels": sum((f["labels"] for f in row), []),
            "seq_lengths": [len(f["input_ids"]) for f in row],
        }
        for row in rows
    ]
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(packed_rows)
    logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
    got = per_sequence_loss(logits, packed["labels"], shift=True, position_ids=packed["position_ids"])
    torch.testing.assert_close(got, unpacked_losses(model, feats), atol=1e-5, rtol=0)
