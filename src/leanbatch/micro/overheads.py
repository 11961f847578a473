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
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch
import torch.nn.functional as F
from torch import Tensor

from leanbatch.checks import check_int
from leanbatch.engine.judging.files import atomic_write_text

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
        return _max_rss()


def _max_rss() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kilobytes on Linux


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    """Peak resident set since the last :func:`_reset_peak` (Linux ``VmHWM``; else since start)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _max_rss()


def _fill(tables: list[Any], n: int, chunk: int = 1 << 20) -> None:
    """Exponentially distributed losses (skewed like real ones), written in chunks to keep memory flat;
    a rank's sharded table (``ShardedScores``) takes the rows it owns."""
    g = torch.Generator().manual_seed(0)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        losses = torch.empty(stop - start).exponential_(generator=g)
        for t in tables:
            part = getattr(t, "slice", None)  # a rank's slice (ShardedScores), or every index
            if part is None:
                t.update(torch.arange(start, stop), losses)
                continue
            first, end = part.rows_in(start, stop)
            idx = part.indices(first, end)
            t.update(idx, losses[idx - start])


def _plan_one(n: int, repeats: int, policy: str, memory: bool) -> dict[str, Any]:
    """Time ``repeats`` plans of ``n`` samples, or (``memory``) measure one plan's memory."""
    from leanbatch import InfoBatch

    warm = InfoBatch(range(4096), num_epochs=2, delta=1.0, seed=0, policy=policy)  # one-off set-up
    _fill([warm.scores], 4096)
    len(warm.sampler)
    del warm
    gc.collect()
    rss0 = resident_bytes()
    ds = InfoBatch(range(n), num_epochs=repeats + 2, prune_ratio=0.5, delta=1.0, seed=0, policy=policy)
    _fill([ds.scores], n)
    ds.scores.values  # noqa: B018 -- flushes queued writes before the clock starts
    gc.collect()
    rss_scores = resident_bytes()
    peak_ok = _reset_peak()
    times = []
    kept = 0
    for r in range(1 if memory else repeats):
        ds.set_epoch(1 + r)
        t0 = time.perf_counter()
        kept = len(ds.sampler)
        times.append(time.perf_counter() - t0)
    if not memory:
        return {
            "plan_s_best": min(times),
            "plan_s_all": times,
            "kept": kept,
            "threads": torch.get_num_threads(),
        }
    peak = _peak_bytes()
    gc.collect()
    return {
        "held_bytes_per_sample": (resident_bytes() - rss0) / n,
        "scores_bytes_per_sample": (rss_scores - rss0) / n,
        "peak_bytes_per_sample": (max(peak, rss_scores) - rss0) / n,
        "peak_is_planning_only": peak_ok,
    }


def _child(fn: Callable[..., Any], args: tuple[Any, ...], queue: Any) -> None:
    try:
        queue.put(fn(*args))
    except BaseException as e:  # report, never hang the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})


def _in_child(fn: Callable[..., Any], *args: Any, env: dict[str, str] | None = None) -> Any:
    """``fn(*args)`` in a fresh (spawned) process started with ``env`` added to its environment;
    ``{"error": ...}`` when it raised or the process died."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, args, queue))
    with patch.dict(os.environ, env or {}):  # what the child starts with, restored here after
        proc.start()
    try:
        out = queue.get()
    finally:
        proc.join()
    if proc.exitcode not in (0, None) and not (isinstance(out, dict) and "error" in out):
        out = {"error": f"subprocess exited with {proc.exitcode}"}
    return out


def bench_plan(sizes: list[int], repeats: int = 3, policy: str = "infobatch") -> list[dict[str, Any]]:
    """Plan one pruning epoch for each size; one row per size.

    Each size runs in two fresh subprocesses: one times ``repeats`` plans (best reported), one
    measures resident memory: held after planning (score table + plan) and the peak while
    planning, both per sample and above the process's footprint before the scores existed.
    ``ValueError`` for ``repeats`` or a size below 1.
    """
    check_int(repeats, "repeats", 1)
    for n in sizes:
        check_int(n, "each size", 1)
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"num_samples": n, "policy": policy}
        row.update(_in_child(_plan_one, n, repeats, policy, False))
        if "error" not in row:
            # A fixed glibc mmap threshold: freed large arrays go back to the system at once, so the
            # resident set counts what is alive, not what the allocator keeps for reuse. Timing runs
            # in its own child with the allocator's default behaviour, as users have it.
            row.update(
                _in_child(_plan_one, n, repeats, policy, True, env={"MALLOC_MMAP_THRESHOLD_": "131072"})
            )
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
    """Microseconds per step of ``update()`` in a pruning epoch, next to two references.

    References: ``loss.mean()`` (what a plain loop does) and the least any InfoBatch update
    must do (scatter the losses into a score array, gather the batch's weights, weighted
    mean), written directly. The variants run in alternating blocks of ``steps`` steps
    (a pruning epoch's worth at most) and the best block of each is reported, so a busy
    spell of a shared machine does not land on one of them.
    """
    from leanbatch import InfoBatch

    check_int(steps, "steps", 1)
    check_int(num_samples, "num_samples", check_int(batch_size, "batch_size", 1))
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    losses = [torch.rand(batch_size, generator=gen).to(dev) for _ in range(8)]

    def fresh() -> Any:
        ds = InfoBatch(range(num_samples), num_epochs=1000, prune_ratio=0.5, delta=1.0, seed=0)
        _fill([ds.scores], num_samples)
        return ds

    ds_explicit, ds_implicit = fresh(), fresh()
    scores = torch.rand(num_samples, device=dev)

    def prepare(epoch: int) -> tuple[list[Tensor], Tensor]:
        """Plan ``epoch`` of both wrappers; serve ds_implicit's samples as a loader would."""
        ds_explicit.set_epoch(epoch)
        order = torch.tensor(list(ds_explicit.sampler), dtype=torch.int64)
        ds_implicit.set_epoch(epoch)
        n = min(steps, order.numel() // batch_size)
        list(islice(ds_implicit.sampler, n * batch_size))  # served, as a loader would fetch them
        batches = [order[i * batch_size : (i + 1) * batch_size].to(dev) for i in range(n)]
        weights = ds_explicit.sampler.plan().weights_on(dev)
        assert weights is not None
        return batches, weights

    def block(fn: Any, batches: list[Tensor]) -> float:
        _sync(dev)
        t0 = time.perf_counter()
        for i, idx in enumerate(batches):
            fn(losses[i % 8], idx)
        _sync(dev)
        return (time.perf_counter() - t0) / len(batches) * 1e6

    best: dict[str, float] = {}
    for r in range(8):
        batches, weights = prepare(r + 1)
        for label, fn in _update_variants(ds_explicit, ds_implicit, scores, weights).items():
            t = block(fn, batches)
            if r > 0:  # the first round warms up
                best[label] = min(best.get(label, float("inf")), t)
    return [{"what": k, "us_per_step": v, "batch_size": batch_size} for k, v in best.items()]


def _update_variants(
    explicit: Any, implicit: Any, scores: Tensor, weights: Tensor
) -> dict[str, Callable[..., Any]]:
    """What :func:`bench_update` times per step, by label: ``fn(loss, indices)``."""
    return {
        "loss.mean() (plain loop)": lambda loss, idx: loss.mean(),
        "least an update does: scatter, gather, weighted mean": lambda loss, idx: (
            scores.index_put_((idx,), loss.detach()),
            (loss * weights.index_select(0, idx)).mean(),
        ),
        "update(loss, indices)": lambda loss, idx: explicit.update(loss, idx),
        "update(loss) (indices from the sampler)": lambda loss, idx: implicit.update(loss),
    }


def format_update(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_update`'s rows."""
    ref = next((r["us_per_step"] for r in rows if r["what"].startswith("least")), None)
    out = [f"| per step (batch of {rows[0]['batch_size']}) | microseconds | vs least |", "|---|---:|---:|"]
    for r in rows:
        ratio = f"{r['us_per_step'] / ref:.2f}" if ref else "-"
        out.append(f"| {r['what']} | {r['us_per_step']:.1f} | {ratio} |")
    out.append("\nbest block of each variant over alternating rounds")
    return "\n".join(out)


def bench_select(batch_size: int, steps: int, device: str = "cpu") -> list[dict[str, Any]]:
    """Milliseconds per step of the small CNN on 28x28 inputs: full step, selection pass, selected step.

    ``ValueError`` unless ``batch_size >= 2`` (the selected half holds a sample) and ``steps >= 1``.
    """
    from leanbatch import SelectiveBackprop, select_indices
    from leanbatch.tasks.images.models import SmallCNN

    check_int(steps, "steps", 1)
    check_int(batch_size, "batch_size", 2)  # the selected half must hold a sample
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

    ms = {f"training step, full batch of {batch_size}": timed(lambda: step(x, y))}
    for scale in (0.5, 1.0):
        sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=scale, interrupt=0, seed=0)
        sel = timed(lambda sb=sb: sb.select((x, y), model, F.cross_entropy, progress=0.5, batch_idx=0))
        ms[f"selection pass (scale {scale:g}, keep 0.5)"] = sel
    half = batch_size // 2
    ms[f"training step on the {half} selected"] = timed(lambda: step(x[:half], y[:half]))
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=0.5, interrupt=0, seed=0)

    def sb_step() -> None:
        step(*sb.select((x, y), model, F.cross_entropy, progress=0.5, batch_idx=0).batch)

    ms["Selective Backprop step (select at 0.5 + train)"] = timed(sb_step)
    losses = torch.rand(batch_size, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    ms["rank rule alone (sort + Gumbel top-k)"] = timed(lambda: select_indices(losses, 0.5, gen))
    full = next(iter(ms.values()))
    return [{"what": k, "ms": v, "of_full_step": v / full} for k, v in ms.items()]


def format_select(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_select`'s rows."""
    out = ["| per step | ms | of a full step |", "|---|---:|---:|"]
    out += [f"| {r['what']} | {r['ms']:.3f} | {r['of_full_step']:.2f} |" for r in rows]
    return "\n".join(out)


def write_json(path: Path, kind: str, rows: list[dict[str, Any]]) -> None:
    """Write one micro-benchmark's rows with the versions they were measured with (atomically)."""
    from leanbatch.engine.judging.results import versions

    atomic_write_text(path, json.dumps({"benchmark": kind, "versions": versions(), "rows": rows}, indent=1))
