"""What a pruning row's per-step bookkeeping costs next to a training step: results.json's ``sync``.

A pruning row calls :meth:`~leanbatch.InfoBatch.update` once a step. Under torchrun every rank
receives every rank's batch rows (an index and a score each: 20 bytes a row carried, 16 by an
all-gather), so that all ranks keep the same scores. The bench sends them inside DDP's gradient
all-reduce of the backward pass that follows (:class:`~leanbatch.carrier.ScoreCarrier`): no
collective of their own. One row per
pruning method, means over its seeds:

- ``bytes_per_step``: the bytes each rank's gathers return per step (0 in one process);
- ``gather_ms``: one step's rows by an all-gather alone, started and awaited at once, timed after
  training with the ranks aligned (:meth:`~leanbatch.bench.world.World.time_gather`; 0 in one process);
- ``overlap_ms``: what the rows add to a training step's forward and backward (DDP's all-reduce
  included) when they travel as in training: inside the gradient all-reduce
  (:meth:`~leanbatch.InfoBatch.carry_scores`), posted before the step and read after it
  (steps with and without them, the difference of medians,
  :meth:`~leanbatch.bench.world.World.time_overlap`; 0 in one process): the sync's cost;
- ``gather_overlap_ms``: the same, the rows sent by the plain all-gather instead (what the carrier
  saves, measured in the same run);
- ``update_ms``: host milliseconds per step in ``update`` during training, mean over ranks: the
  bookkeeping, starting the gather, and the waits when queued scores are written; on CUDA the
  host's time, not the device's;
- ``step_ms``: training wall-clock per step (the slowest rank's);
- ``carried_share``: the share of the rows that rode the all-reduce (1.0 under torchrun; rows of
  a step without a backward go by the all-gather);
- ``share``: ``overlap_ms / step_ms`` (in one process, ``update_ms / step_ms``).

DDP's own gradient all-reduce is part of the step, not of this cost.

Example:
    >>> from leanbatch.bench.records import EpochRecord, RunResult
    >>> e = EpochRecord(0, 2.0, 2.0, 90.0, 0.3, 0.3, 10, 100, 100, 0, 100, 0.1, update_time=0.02, gathered_bytes=2400)
    >>> run = RunResult("infobatch", "infobatch", 0, 100, [e], gather_time=0.001, overlap_time=0.0004,
    ...                 gather_overlap_time=0.0008)
    >>> row = sync_costs([run], ["infobatch"], world=2)["rows"][0]
    >>> row["bytes_per_step"], row["gather_ms"], row["overlap_ms"], row["gather_overlap_ms"], row["share"]
    (240.0, 1.0, 0.4, 0.8, 0.002)
    >>> print(format_sync(sync_costs([run], ["infobatch"], world=2)).splitlines()[0])
    per-step cost of InfoBatch.update (torchrun, 2 processes):
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leanbatch.bench.frontier import mean_of
from leanbatch.bench.records import RunResult

__all__ = ["format_sync", "sync_costs"]

_KEYS = (
    "bytes_per_step",
    "gather_ms",
    "overlap_ms",
    "gather_overlap_ms",
    "update_ms",
    "step_ms",
    "carried_share",
)


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
        "gather_overlap_ms": 1000.0 * run.gather_overlap_time,
        "carried_share": run.carried_share,
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
        f"per-step cost of InfoBatch.update ({where}{_carried(section['rows'])}):",
        "",
        "| method | bytes received / step | all-gather ms (alone) | ms added to a step: in the all-reduce "
        "| ms added: by an all-gather | update ms (in training) | step ms | added share of a step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in section["rows"]:
        share = "-" if r["share"] is None else f"{100 * r['share']:.2f}%"
        lines.append(
            f"| {r['method']} | {r['bytes_per_step']:,.0f} | {r['gather_ms']:.3f} | {r['overlap_ms']:.3f} "
            f"| {r.get('gather_overlap_ms', 0.0):.3f} | {r['update_ms']:.3f} "
            f"| {r['step_ms']:.2f} | {share} |"
        )
    return "\n".join(lines)


def _carried(rows: list[dict[str, Any]]) -> str:
    """The heading's note on how the rows travelled (every row the same way, else nothing said)."""
    shares = {r.get("carried_share", 0.0) for r in rows}
    return "; the rows ride DDP's gradient all-reduce" if shares == {1.0} else ""
