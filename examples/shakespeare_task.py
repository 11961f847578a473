"""A causal language model on Tiny Shakespeare: InfoBatch, token selection and their twins, judged.

A small character-level transformer (plain PyTorch) trained on fixed windows of the first 90% of
the text, evaluated by its mean token loss on windows of the last 10% (``eval_loss``, lower is
better). Judge the methods against the baseline trained shorter and longer (the envelope: token
selection costs more than the baseline, a reference model's forwards and training) and their twins::

    leanbatch bench --task examples/shakespeare_task.py:train --metric eval_loss --seeds 0,1 --controls \\
        --methods baseline,infobatch,token-selection --budgets 0.5,0.75,1,1.5 --batch-budgets none --threads 1

(``--threads 1`` on a shared machine: two OpenMP threads per process stall whenever another is busy.)

The text is read from ``$LEANBATCH_TEXT``, else ``../shared/data/tinyshakespeare.txt`` beside the
checkout (any UTF-8 text works). Every arm calls ``run.token_loss``: the token arms choose tokens
there, the others train each window's mean token loss through ``run.wrap``'s data (InfoBatch's
scores and weights). ``token-selection`` ranks tokens by excess loss over a reference model of the
same shape trained first on a held-out tenth of the training windows (RHO-1's recipe at this
scale); the reference's training and its forwards are charged to the run (``run.charge``), its
twin (``policy=random``) needs neither.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from leanbatch import ProgressLR, cosine

DEFAULT_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


@dataclass(frozen=True)
class Size:
    """The task's size: windows of ``seq_len`` characters, the model, the schedule."""

    seq_len: int = 64
    train_windows: int = 3000  # taken evenly from the first 90% of the text
    eval_windows: int = 300  # from the last 10%
    epochs: int = 4
    batch_size: int = 32
    width: int = 64
    layers: int = 2
    heads: int = 4
    lr: float = 3e-3
    reference_epochs: int = 4  # the reference model's epochs on the held-out tenth


class Windows(Dataset):
    """Fixed windows of a text's character ids: item ``i`` is ``(ids, i)``."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.ids[i], i


class CharLM(nn.Module):
    """A small causal transformer over characters: logits ``(rows, T, vocab)``."""

    def __init__(self, vocab: int, size: Size):
        super().__init__()
        self.embed = nn.Embedding(vocab, size.width)
        self.pos = nn.Parameter(torch.zeros(size.seq_len, size.width))
        layer = nn.TransformerEncoderLayer(
            size.width, size.heads, 4 * size.width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.head = nn.Linear(size.width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(self.embed(x) + self.pos[:t], mask=mask, is_causal=True)
        return self.head(h)


def windows(ids: torch.Tensor, seq_len: int, count: int) -> torch.Tensor:
    """``count`` windows of ``seq_len`` ids, evenly spaced over ``ids`` (non-overlapping when they fit)."""
    last = ids.numel() - seq_len
    starts = torch.linspace(0, last, count).long()
    return ids[starts[:, None] + torch.arange(seq_len)]


def corpus(text: str, size: Size) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Training and evaluation windows of ``text`` (cut by position at 90%) and the vocabulary size."""
    chars = sorted(set(text))
    table = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([table[c] for c in text])
    cut = int(0.9 * ids.numel())
    train = windows(ids[:cut], size.seq_len, size.train_windows)
    return train, windows(ids[cut:], size.seq_len, size.eval_windows), len(chars)


@torch.no_grad()
def eval_loss(model: nn.Module, data: torch.Tensor) -> float:
    """The mean next-character loss over the evaluation windows."""
    model.eval()
    logits = model(data)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
    model.train()
    return float(loss)


def train_reference(train: torch.Tensor, vocab: int, size: Size, seed: int) -> tuple[nn.Module, int]:
    """RHO-1's reference model: the same shape, trained on every tenth training window (held out of
    nothing: a small clean subset, as the paper's high-quality data); returns it and the samples it trained."""
    torch.manual_seed(seed + 10_000)
    held = train[::10]
    model = CharLM(vocab, size)
    opt = torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.01)
    for _ in range(size.reference_epochs):
        for batch in held[torch.randperm(held.shape[0])].split(size.batch_size):
            logits = model(batch)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), batch[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model, held.shape[0] * size.reference_epochs


def make_task(text: str, size: Size = Size()) -> Callable[[Any], float]:
    """The task ``train(run) -> eval_loss`` on ``text`` at ``size``."""
    train_ids, eval_ids, vocab = corpus(text, size)

    def train(run: Any) -> float:
        torch.manual_seed(run.seed)
        model = CharLM(vocab, size)
        opt = torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.01)
        ds = run.wrap(Windows(train_ids), size.epochs)  # the clock starts: the reference's training is timed
        reference = None
        if run.kind == "token-selection" and run.settings["policy"] == "excess":
            reference, trained = train_reference(train_ids, vocab, size, run.seed)
            run.charge(forwarded=trained, backpropagated=trained)  # its training, at the model's cost
        loader = DataLoader(ds, batch_size=run.batch_size(size.batch_size), sampler=ds.sampler)
        sched = ProgressLR(opt, ds, cosine(warmup=0.05))
        loss_now = math.inf
        for epoch in range(ds.epoch, ds.num_epochs):  # a budget above 1 trains more epochs
            ds.set_epoch(epoch)
            for x, idx in loader:
                ref = None if reference is None else (lambda x=x: reference(x))
                loss = run.token_loss(ds, model(x), x, indices=idx, reference=ref)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
            with run.untimed():
                loss_now = eval_loss(model, eval_ids)
            run.log(epoch=epoch, eval_loss=loss_now)
        return loss_now

    return train


_TASK: Callable[[Any], float] | None = None


def train(run: Any) -> float:
    """The task on ``$LEANBATCH_TEXT`` (default: Tiny Shakespeare beside the checkout) at the default size."""
    global _TASK
    if _TASK is None:
        path = Path(os.environ.get("LEANBATCH_TEXT", DEFAULT_TEXT))
        if not path.is_file():
            raise FileNotFoundError(
                f"no text at {path}: set LEANBATCH_TEXT to a UTF-8 text file (Tiny Shakespeare)"
            )
        _TASK = make_task(path.read_text(encoding="utf-8"))
    return _TASK(run)
