"""Micro-benchmarks of the library's own overheads (``leanbatch micro plan|update|select``).

- ``plan``: wall-clock to plan one pruning epoch through the public API (scores filled with
  ``ds.scores.update``, then ``len(ds.sampler)`` plans), and memory: bytes per sample held
  between steps (score table + plan) and the peak while planning. Each size runs in a fresh
  subprocess so the resident-set figures are its own.
- ``update``: microseconds per ``InfoBatch.update()`` call on a batch, explicit and implicit
  indices, next to a plain ``loss.mean()``.
- ``select``: Selective Backprop's selection pass per step, next to a full and a selected
  training step of the benchmark's small CNN on MNIST-sized inputs.

Times are the best of a few repeats (planning) or means over many steps (per-step figures).
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "bench_plan",
    "bench_update",
    "bench_select",
    "format_plan",
    "format_update",
    "format_select",
    "write_json",
    "resident_bytes",
]


def resident_bytes() -> int:
    """Resident set size of this process in bytes (Linux ``/proc``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _peak_bytes() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kilobytes on Linux


class _Range(torch.utils.data.Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _fill_scores(ds: Any, n: int, seed: int = 0, chunk: int = 1 << 20) -> None:
    """Exponentially distributed losses (skewed like real ones), written in chunks to keep memory flat."""
    g = torch.Generator().manual_seed(seed)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        ds.scores.update(torch.arange(start, stop), torch.empty(stop - start).exponential_(generator=g))


def _plan_one(n: int, repeats: int, policy: str) -> dict[str, Any]:
    from leanbatch import InfoBatch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    gc.collect()
    rss0 = resident_bytes()
    ds = InfoBatch(_Range(n), num_epochs=repeats + 2, prune_ratio=0.5, delta=1.0, seed=0, policy=policy)
    _fill_scores(ds, n)
    gc.collect()
    rss_scores = resident_bytes()
    peak_before = _peak_bytes()
    times = []
    kept = 0
    for r in range(repeats):
        ds.set_epoch(1 + r)
        t0 = time.perf_counter()
        kept = len(ds.sampler)
        times.append(time.perf_counter() - t0)
    gc.collect()
    rss_held = resident_bytes()
    peak = max(_peak_bytes(), peak_before)
    return {
        "num_samples": n,
        "policy": policy,
        "plan_s_best": min(times),
        "plan_s_all": times,
        "kept": kept,
        "held_bytes_per_sample": (rss_held - rss0) / n,
        "scores_bytes_per_sample": (rss_scores - rss0) / n,
        "peak_bytes_per_sample": (peak - rss0) / n,
        "threads": torch.get_num_threads(),
    }


def _plan_child(n: int, repeats: int, policy: str, queue: Any) -> None:
    try:
        queue.put(_plan_one(n, repeats, policy))
    except BaseException as e:  # report, never hang the parent
        queue.put({"num_samples": n, "error": f"{type(e).__name__}: {e}"})


def bench_plan(sizes: list[int], repeats: int = 3, policy: str = "infobatch") -> list[dict[str, Any]]:
    """Plan one pruning epoch for each size (in a fresh subprocess); one row per size."""
    ctx = mp.get_context("spawn")
    rows = []
    for n in sizes:
        queue = ctx.Queue()
        proc = ctx.Process(target=_plan_child, args=(n, repeats, policy, queue))
        proc.start()
        try:
            row = queue.get()
        finally:
            proc.join()
        if proc.exitcode not in (0, None) and "error" not in row:
            row["error"] = f"subprocess exited with {proc.exitcode}"
        rows.append(row)
    return rows


def format_plan(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_plan`'s rows."""
    out = [
        "| samples | plan one epoch | kept | held bytes/sample | of which scores | peak bytes/sample |",
        "|--------:|---------------:|-----:|------------------:|----------------:|------------------:|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['num_samples']:,} | error: {r['error']} | | | | |")
            continue
        out.append(
            f"| {r['num_samples']:,} | {r['plan_s_best'] * 1e3:,.1f} ms | {r['kept']:,} "
            f"| {r['held_bytes_per_sample']:.1f} | {r['scores_bytes_per_sample']:.1f} "
            f"| {r['peak_bytes_per_sample']:.1f} |"
        )
    pol = rows[0].get("policy", "infobatch") if rows else "infobatch"
    out.append(
        f"\npolicy {pol}; exponential scores; best of the repeats; RSS measured in a fresh process per size"
    )
    return "\n".join(out)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_update(num_samples: int, batch_size: int, steps: int, device: str = "cpu") -> list[dict[str, Any]]:
    """Microseconds per step: ``loss.mean()``, ``update(loss, idx)`` and ``update(loss)`` in a pruning epoch."""
    from leanbatch import InfoBatch

    dev = torch.device(device)
    rows = []

    def timed(label: str, fn: Any, prepare: Any) -> None:
        for i in range(min(20, steps)):  # warm-up
            fn(*prepare(i))
        args = [prepare(i) for i in range(steps)]
        _sync(dev)
        t0 = time.perf_counter()
        for a in args:
            fn(*a)
        _sync(dev)
        rows.append(
            {"what": label, "us_per_step": (time.perf_counter() - t0) / steps * 1e6, "batch_size": batch_size}
        )

    losses = [torch.rand(batch_size, device=dev) for _ in range(8)]

    def loss_of(i: int) -> torch.Tensor:
        return losses[i % 8]

    timed("loss.mean() (reference)", lambda loss: loss.mean(), lambda i: (loss_of(i),))

    ds = InfoBatch(_Range(num_samples), num_epochs=10, prune_ratio=0.5, delta=0.875, seed=0)
    _fill_scores(ds, num_samples)
    ds.set_epoch(1)
    order = torch.tensor(list(ds.sampler), dtype=torch.int64)
    nb = max(1, order.numel() // batch_size)
    timed(
        "update(loss, indices)",
        lambda loss, idx: ds.update(loss, idx),
        lambda i: (loss_of(i), order[(i % nb) * batch_size : (i % nb + 1) * batch_size]),
    )

    ds2 = InfoBatch(_Range(num_samples), num_epochs=10, prune_ratio=0.5, delta=0.875, seed=0)
    _fill_scores(ds2, num_samples)
    ds2.set_epoch(1)
    it = iter(ds2.sampler)
    total = len(ds2.sampler)
    n_steps = min(steps, total // batch_size)
    for _ in range(n_steps * batch_size):  # served by the sampler, as a DataLoader would
        next(it)
    _sync(dev)
    t0 = time.perf_counter()
    for i in range(n_steps):
        ds2.update(loss_of(i))
    _sync(dev)
    rows.append(
        {
            "what": "update(loss) (implicit indices)",
            "us_per_step": (time.perf_counter() - t0) / n_steps * 1e6,
            "batch_size": batch_size,
        }
    )
    return rows


def format_update(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_update`'s rows."""
    out = [f"| per step (batch of {rows[0]['batch_size']}) | microseconds |", "|---|---:|"]
    out += [f"| {r['what']} | {r['us_per_step']:.1f} |" for r in rows]
    return "\n".join(out)


def bench_select(batch_size: int, steps: int, device: str = "cpu") -> list[dict[str, Any]]:
    """Milliseconds per step of the small CNN on 28x28 inputs: full step, selection pass, selected step."""
    from leanbatch.bench.models import SmallCNN
    from leanbatch.selection import SelectiveBackprop, select_indices

    dev = torch.device(device)
    torch.manual_seed(0)
    model = SmallCNN(1, 10).to(dev).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, 1, 28, 28, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch_size,), device=dev)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        loss = F.cross_entropy(model(xb.contiguous(memory_format=torch.channels_last)), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def timed(fn: Any) -> float:
        for _ in range(5):
            fn()
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(dev)
        return (time.perf_counter() - t0) / steps * 1e3

    rows: list[dict[str, Any]] = []
    full = timed(lambda: step(x, y))
    rows.append({"what": f"training step, full batch of {batch_size}", "ms": full, "of_full_step": 1.0})
    for scale in (0.5, 1.0):
        sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=scale, interrupt=0, seed=0)
        sel = timed(lambda sb=sb: sb.select((x, y), model, F.cross_entropy, progress=0.5, batch_idx=0))
        rows.append(
            {"what": f"selection pass (scale {scale:g}, keep 0.5)", "ms": sel, "of_full_step": sel / full}
        )
    half = batch_size // 2
    part = timed(lambda: step(x[:half], y[:half]))
    rows.append({"what": f"training step on the {half} selected", "ms": part, "of_full_step": part / full})
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=0.5, interrupt=0, seed=0)

    def sb_step() -> None:
        out = sb.select((x, y), model, F.cross_entropy, progress=0.5, batch_idx=0)
        step(*out.batch)

    total = timed(sb_step)
    rows.append(
        {"what": "Selective Backprop step (select at 0.5 + train)", "ms": total, "of_full_step": total / full}
    )
    losses = torch.rand(batch_size, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rank = timed(lambda: select_indices(losses, 0.5, gen))
    rows.append({"what": "rank rule alone (sort + Gumbel top-k)", "ms": rank, "of_full_step": rank / full})
    return rows


def format_select(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_select`'s rows."""
    out = ["| per step | ms | of a full step |", "|---|---:|---:|"]
    out += [f"| {r['what']} | {r['ms']:.3f} | {r['of_full_step']:.2f} |" for r in rows]
    return "\n".join(out)


def write_json(path: Path, kind: str, rows: list[dict[str, Any]]) -> None:
    """Write one micro-benchmark's rows with the versions they were measured with."""
    from leanbatch.bench.report import versions

    path.write_text(json.dumps({"benchmark": kind, "versions": versions(), "rows": rows}, indent=1))
