"""A task whose loop lives in a helper module (``engine_loop.py``); its own module never names the hook."""

from __future__ import annotations

import torch
from engine_loop import loop
from torch.utils.data import TensorDataset

_g = torch.Generator().manual_seed(1)
DATA = TensorDataset(torch.randn(256, 8, generator=_g), torch.randint(0, 4, (256,), generator=_g))


def train(run):  # type: ignore[no-untyped-def]
    return loop(run, DATA, 2)
