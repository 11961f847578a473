"""Models and helpers shared by the selection tests."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

READS = ["item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"]


def forbid_host_reads(monkeypatch: pytest.MonkeyPatch, masks: bool = False) -> None:
    """A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: every Python read of a tensor
    value (item, tolist, bool(), nonzero, and with ``masks`` boolean-mask indexing) raises."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("host read of a tensor value in the per-step path")

    getitem = torch.Tensor.__getitem__

    def guarded_getitem(self: torch.Tensor, key: object) -> torch.Tensor:
        if isinstance(key, torch.Tensor) and key.dtype == torch.bool:
            boom()
        return getitem(self, key)

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, boom)
    if masks:
        monkeypatch.setattr(torch.Tensor, "__getitem__", guarded_getitem)
    monkeypatch.setattr(torch, "nonzero", boom)


def cnn(c_in: int = 1, n_cls: int = 10, dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(c_in, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(16, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, n_cls),
    )


def conv_net(width: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10),
    )  # fmt: skip


def snapshot(model: nn.Module) -> tuple[list[torch.Tensor], list[bool]]:
    return [b.clone() for b in model.buffers()], [m.training for m in model.modules()]


def assert_same_state(model: nn.Module, snap: tuple[list[torch.Tensor], list[bool]]) -> None:
    bufs, modes = snap
    assert all(torch.equal(a, b) for a, b in zip(bufs, model.buffers(), strict=True))
    assert modes == [m.training for m in model.modules()]


def snapshot_all(model: nn.Module) -> tuple[list[torch.Tensor], list[bool]]:
    return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]], [
        m.training for m in model.modules()
    ]


def same_state(model: nn.Module, snap: tuple[list[torch.Tensor], list[bool]]) -> bool:
    tensors, modes = snap
    now = [*model.parameters(), *model.buffers()]
    return all(torch.equal(a, b) for a, b in zip(tensors, now, strict=True)) and modes == [
        m.training for m in model.modules()
    ]


def saved(state: dict) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


class TinyLM(nn.Module):
    """Hugging Face-like: keyword inputs, returns an object with .logits."""

    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        return SimpleNamespace(logits=self.head(h))


class CountingModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.lin(x)
