"""Determinism and resume for the new policies: a run checkpointed mid-epoch (state through
``torch.load(weights_only=True)``) and resumed in a fresh process state reproduces the run."""

import pytest
import torch
from test_resume import BS, EPOCHS, N
from test_resume import run as resume_run
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import EpsilonGreedyPolicy, InfoBatch, InfoBatchPolicy, RS2Policy, SeTaPolicy, UCBPolicy

POLICIES = {
    "infobatch-options": lambda: InfoBatchPolicy(
        0.3, EPOCHS, 0.75, target="all", refresh_every=3, max_weight=1.8
    ),
    "rs2": lambda: RS2Policy(0.7, EPOCHS, seed=2),
    "epsilon-greedy": lambda: EpsilonGreedyPolicy(0.5, EPOCHS, epsilon=0.3),
    "ucb": lambda: UCBPolicy(0.5, EPOCHS, epsilon=0.2, c=0.5),
    "seta": lambda: SeTaPolicy(0.2, EPOCHS, num_groups=4, window_scale=0.5, delta=0.75),
}


def make(name):
    data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
    ds = InfoBatch(data, EPOCHS, seed=11, policy=POLICIES[name]())
    return ds, DataLoader(ds, batch_size=BS, sampler=ds.sampler)


def run(name, stop_at=None):
    return resume_run(stop_at, make=lambda: make(name))


@pytest.mark.parametrize("name", list(POLICIES))
def test_resume_reproduces_the_run(name):
    ref_log, ref_ds = run(name)
    again, _ = run(name)
    assert again == ref_log  # deterministic
    assert any(s["pruning"] and s["kept"] < N for s in ref_ds.epoch_stats)
    first = sum(1 for e, *_ in ref_log if e == 0)
    for stop in (first + 3, len(ref_log) - 4):
        log, ds = run(name, stop)
        assert log == ref_log, f"{name}: stopped at step {stop}"
        assert same(ds.scores.values, ref_ds.scores.values) and ds.epoch_stats == ref_ds.epoch_stats
        if ds.scores.tracks_variance:
            assert same(ds.scores.variances, ref_ds.scores.variances)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN (never scored) included."""
    return torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))
