"""The per-step path reads no tensor value: a CPU stand-in for CUDA's no-host-sync rule.

Tensors on PyTorch's ``meta`` device have shapes and dtypes but no data, so any
``.item()``, ``bool()``, ``.tolist()``, boolean-mask indexing, ``nonzero`` or copy to the
host raises on them. Everything that runs per step on an accelerator (storing scores,
flushing the queue, gathering weights, the weighted mean and its backward, explicit-index
checks) runs here on ``meta``; planning an epoch, which may read values, happens before.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ScoreTable

N = 1000


def test_score_table_store_and_flush_read_no_value():
    table = ScoreTable(N, device="meta")
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):  # > flush_every samples: the queue is flushed on the device path
        idx = torch.randint(0, N, (32,), generator=gen).to("meta")
        table.store(idx, torch.empty(32, device="meta"), check=True)  # the asynchronous range check
    table.flush()
    assert table.values.device.type == "meta" and table._pending_n == 0


def test_infobatch_update_reads_no_value_in_a_pruning_epoch():
    ds = InfoBatch(TensorDataset(torch.arange(N)), 4, seed=0)
    ds.scores.update(torch.arange(N), torch.rand(N, generator=torch.Generator().manual_seed(1)))
    ds.set_epoch(1)
    assert ds.sampler.plan().pruning
    it = iter(DataLoader(ds, batch_size=32, sampler=ds.sampler))
    next(it)  # plans the epoch on the CPU: planning may read values
    ds.scores.to("meta")  # from here on, every tensor of the per-step path is on meta
    for step in range(10):
        if step:
            next(it)
        loss = torch.empty(32, device="meta", requires_grad=True)
        out = ds.update(loss)  # indices from the sampler's ledger
        out.backward()
        assert out.device.type == "meta" and loss.grad is not None
        next(it)
        idx = torch.randint(0, N, (32,)).to("meta")
        assert ds.weights(idx).device.type == "meta"
        if step % 2:
            out = ds.update(torch.empty(32, device="meta", requires_grad=True), idx)  # explicit indices
        else:  # a selected subset of the batch (Selective Backprop): positions on the device
            pos = torch.arange(0, 32, 2).to("meta")
            out = ds.update(torch.empty(16, device="meta", requires_grad=True), idx, positions=pos)
        out.backward()
    ds.scores.flush()
    assert ds.scores.values.device.type == "meta"
