"""What a pruning row's per-step bookkeeping costs next to a training step: results.json's ``sync``.

A pruning row calls :meth:`~leanbatch.InfoBatch.update` once a step. Under torchrun that call
holds leanbatch's only per-step collective: every rank gathers every rank's batch rows (an index
and a score each, as float64: 16 bytes a row, one all-gather), so that all ranks keep the same
scores. The gather is started in ``update`` and waited for when the scores are flushed (every
8,192 rows, and when read), so it runs during the backward pass. One row per
pruning method, means over its seeds:

- ``bytes_per_step``: the bytes each rank's gathers return per step (0 in one process);
- ``gather_ms``: one step's gather alone, started and awaited at once, timed after training with
  the ranks aligned (:meth:`~leanbatch.bench.world.World.time_gather`; 0 in one process);
- ``overlap_ms``: what the gather adds to a training step's forward and backward when it runs as
  in training, started before the step and awaited after it (alternating steps with and without,
  :meth:`~leanbatch.bench.world.World.time_overlap`; 0 in one process): the sync's cost;
- ``update_ms``: host milliseconds per step in ``update`` during training, mean over ranks: the
  bookkeeping, starting the gather, and the waits when queued scores are written; on CUDA the
  host's time, not the device's;
- ``step_ms``: training wall-clock per step (the slowest rank's);
- ``share``: ``overlap_ms / step_ms`` (in one process, ``update_ms / step_ms``).

DDP's own gradient all-reduce is part of the step, not of this cost.

Example:
    >>> from leanbatch.bench.records import EpochRecord, RunResult
    >>> e = EpochRecord(0, 2.0, 2.0, 90.0, 0.3, 0.3, 10, 100, 100, 0, 100, 0.1, update_time=0.02, gathered_bytes=2400)
    >>> run = RunResult("infobatch", "infobatch", 0, 100, [e], gather_time=0.001, overlap_time=0.0004)
    >>> row = sync_costs([run], ["infobatch"], world=2)["rows"][0]
    >>> row["bytes_per_step"], row["gather_ms"], row["overlap_ms"], row["update_ms"], row["step_ms"], row["share"]
    (240.0, 1.0, 0.4, 2.0, 200.0, 0.002)
    >>> print(format_sync(sync_costs([run], ["infobatch"], world=2)).splitlines()[0])
    per-step cost of InfoBatch.update (torchrun, 2 processes; DDP's gradient all-reduce not included):
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leanbatch.bench.frontier import mean_of
from leanbatch.bench.records import RunResult

__all__ = ["format_sync", "sync_costs"]

_KEYS = ("bytes_per_step", "gather_ms", "overlap_ms", "update_ms", "step_ms")


def sync_costs(runs: Sequence[RunResult], order: Sequence[str], world: int = 1) -> dict[str, Any]:
    """results.json's ``sync``: ``world`` and one row per label of ``order`` whose runs updated scores."""
    rows = []
    for label in order:
        per_seed = [p for r in runs if r.label == label and (p := _per_step(r)) is not None]
        if not per_seed:
            continue
        row: dict[str, Any] = {k: mean_of([p[k] for p in per_seed]) for k in _KEYS}
        cost = row["overlap_ms"] if world > 1 else row["update_ms"]
        row["share"] = cost / row["step_ms"] if row["step_ms"] > 0 else None
        rows.append({"method": label, "seeds": len(per_seed), **row})
    return {"world_size": world, "rows": rows}


def _per_step(run: RunResult) -> dict[str, float] | None:
    """A run's per-step figures; None when it never updated scores (no pruning)."""
    steps = sum(e.steps for e in run.epochs)
    update = sum(e.update_time for e in run.epochs)
    if steps == 0 or update == 0.0:
        return None
    setup = 0.0 if run.setup is None else run.setup["time_s"]
    return {
        "bytes_per_step": sum(e.gathered_bytes for e in run.epochs) / steps,
        "gather_ms": 1000.0 * run.gather_time,
        "overlap_ms": 1000.0 * run.overlap_time,
        "update_ms": 1000.0 * update / steps,
        "step_ms": 1000.0 * (run.train_time - setup) / steps,
    }


def format_sync(section: dict[str, Any]) -> str:
    """The ``sync`` section as a Markdown table (one line when no row updated scores)."""
    world = section["world_size"]
    where = f"torchrun, {world} processes" if world > 1 else "one process: no collective"
    if not section["rows"]:
        return f"per-step cost of InfoBatch.update ({where}): no pruning row"
    lines = [
        f"per-step cost of InfoBatch.update ({where}; DDP's gradient all-reduce not included):",
        "",
        "| method | bytes gathered / step | gather ms (alone) | ms added to a step (overlapped) "
        "| update ms (in training) | step ms | added share of a step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in section["rows"]:
        share = "-" if r["share"] is None else f"{100 * r['share']:.2f}%"
        lines.append(
            f"| {r['method']} | {r['bytes_per_step']:,.0f} | {r['gather_ms']:.3f} | {r['overlap_ms']:.3f} "
            f"| {r['update_ms']:.3f} "
            f"| {r['step_ms']:.2f} | {share} |"
        )
    return "\n".join(lines)
