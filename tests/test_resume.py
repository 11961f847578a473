"""Resume: a run checkpointed anywhere and resumed reproduces the uninterrupted run."""

import io

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch

N, EPOCHS, BS = 240, 4, 16


def make():
    data = TensorDataset(torch.arange(N, dtype=torch.float32), torch.arange(N))
    ds = InfoBatch(data, EPOCHS, prune_ratio=0.6, delta=0.75, seed=11)
    return ds, DataLoader(ds, batch_size=BS, sampler=ds.sampler)


def loss_of(x, epoch):
    # losses that change over training, so plans depend on the whole history
    return torch.sin(x * (epoch + 1)).abs() + 0.01


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def run(stop_at=None, explicit_epochs=True, make=make):
    """Train; at global step ``stop_at`` checkpoint, rebuild everything (with ``make``), resume."""
    ds, loader = make()
    log, step, epoch = [], 0, 0
    while epoch < EPOCHS:
        if explicit_epochs:
            ds.set_epoch(epoch)
        resumed = False
        for x, i in loader:
            out = ds.update(loss_of(x, epoch))
            log.append((epoch, i.tolist(), round(float(out), 6)))
            step += 1
            if step == stop_at:
                state = roundtrip(ds.state_dict())
                ds, loader = make()
                ds.load_state_dict(state)
                resumed = True
                break
        if resumed:
            # a resumed script restarts its epoch loop from the saved epoch
            epoch = state["sampler"]["epoch"] + (1 if state["sampler"]["finished"] else 0)
            continue
        epoch += 1
    return log, ds


@pytest.mark.parametrize("explicit_epochs", [True, False])
def test_resume_mid_epoch_and_at_epoch_end_reproduce_the_run(explicit_epochs):
    ref_log, ref_ds = run(explicit_epochs=explicit_epochs)
    steps = len(ref_log)
    first_epoch_steps = sum(1 for e, *_ in ref_log if e == 0)
    for stop in (3, first_epoch_steps, first_epoch_steps + 5, steps - 2):
        log, ds = run(stop_at=stop, explicit_epochs=explicit_epochs)
        assert log == ref_log, f"stopped at step {stop}"
        assert torch.equal(ds.scores.values, ref_ds.scores.values)
        assert ds.epoch_stats == ref_ds.epoch_stats
        assert ds.get_pruned_count() == ref_ds.get_pruned_count() > 0


def test_state_dict_is_plain_tensors_and_values():
    ds, loader = make()
    for x, _ in loader:
        ds.update(loss_of(x, 0))
    state = roundtrip(ds.state_dict())  # weights_only=True would raise on anything else
    assert state["sampler"]["epoch"] == 0 and state["sampler"]["finished"] is True
    assert state["scores"]["values"].dtype == torch.float32
