"""``leanbatch micro plan --world W --shard``: sharded planning per rank, W ranks simulated in one process.

Each rank holds a sharded score table of its ``ceil((N - r) / W)`` rows, filled with the same
exponential scores as one unsharded table of ``N``; the ranks plan each epoch in turns (see
:class:`~leanbatch.distributed.simulate.SimulatedWorld`: every collective combined exactly as
``torch.distributed`` would), and each rank's plan time is its own turns summed. Bytes held are
the tensors a rank keeps between steps, by ``nbytes`` (not the resident set): its scores (the
spare slot included) and its plan (kept indices and weights). The unsharded row plans the same
scores in one table, for comparison. Each mode runs in a fresh subprocess.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from leanbatch.checks import check_int
from leanbatch.micro.overheads import _fill, _in_child

__all__ = ["bench_plan_sharded", "format_plan_sharded"]


def _measure(n: int, world: int, sharded: bool, repeats: int, policy: str) -> list[dict[str, Any]]:
    import time

    from leanbatch import InfoBatchPolicy, RandomPolicy, ScoreTable
    from leanbatch.distributed import ShardedScores
    from leanbatch.distributed.simulate import SimulatedWorld
    from leanbatch.epochs import plan_epoch

    cls = InfoBatchPolicy if policy == "infobatch" else RandomPolicy
    ranks = world if sharded else 1
    tables = [ShardedScores(n, ranks, r) if sharded else ScoreTable(n) for r in range(ranks)]
    _fill(tables, n)
    sim = SimulatedWorld(ranks)
    pol = cls(0.5, repeats + 2, 1.0)

    def planned(r: int, epoch: int) -> Any:
        return plan_epoch(pol, tables[r], epoch, 0, ranks, r, comm=sim.comm(r))[0]

    best = [float("inf")] * ranks
    for epoch in range(1, repeats + 1):
        sim.busy = [0.0] * ranks
        t0 = time.perf_counter()
        sim.run([partial(planned, r, epoch) for r in range(ranks)])
        wall = time.perf_counter() - t0
        times = sim.busy if sharded else [wall]
        best = [min(b, t) for b, t in zip(best, times, strict=True)]
    plans = sim.run([partial(planned, r, repeats) for r in range(ranks)])
    return [
        {
            "num_samples": n,
            "world": world,
            "sharded": sharded,
            "rank": r,
            "plan_s": best[r],
            "score_bytes": t.nbytes,
            "plan_bytes": sum(0 if x is None else x.nbytes for x in (plan.kept, plan.weights)),
            "kept": plan.num_kept,
            "policy": policy,
        }
        for r, (t, plan) in enumerate(zip(tables, plans, strict=True))
    ]


def bench_plan_sharded(
    sizes: list[int], world: int, repeats: int = 3, policy: str = "infobatch"
) -> list[dict[str, Any]]:
    """Per size: the unsharded plan (one process) and every simulated rank's sharded plan; one row each.

    Each mode runs in a fresh subprocess; see the module docstring for what is measured.
    ``leanbatch micro plan --sizes 1e6,1e8 --world 8 --shard`` prints its table.
    """
    check_int(world, "world", 1)
    check_int(repeats, "repeats", 1)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        check_int(n, "each size", world)
        for sharded in (False, True):
            out = _in_child(_measure, n, world, sharded, repeats, policy)
            rows.extend([{"num_samples": n, "sharded": sharded, **out}] if isinstance(out, dict) else out)
    return rows


def format_plan_sharded(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`bench_plan_sharded`'s rows (per rank), and the largest rank per size.

    Example:
        >>> row = {"num_samples": 8, "world": 2, "sharded": True, "rank": 0, "plan_s": 0.001,
        ...        "score_bytes": 20, "plan_bytes": 24, "kept": 6, "policy": "random"}
        >>> format_plan_sharded([row]).splitlines()[2].split("|")[4].strip()
        '1.0 ms'
    """
    out = [
        "| samples | mode | rank | plan one epoch | scores held | plan held | bytes x world / N |",
        "|--------:|------|-----:|---------------:|------------:|----------:|------------------:|",
    ]
    for r in rows:
        if "error" in r:
            out.append(
                f"| {r['num_samples']:,} | {'sharded' if r['sharded'] else 'unsharded'} | | error: {r['error']} | | | |"
            )
            continue
        mode = f"sharded / {r['world']}" if r["sharded"] else "unsharded"
        ranks = r["world"] if r["sharded"] else 1
        held = r["score_bytes"] + r["plan_bytes"]
        out.append(
            f"| {r['num_samples']:,} | {mode} | {r['rank'] if r['sharded'] else '-'} | {r['plan_s'] * 1e3:,.1f} ms "
            f"| {r['score_bytes'] / 2**20:,.1f} MiB | {r['plan_bytes'] / 2**20:,.1f} MiB "
            f"| {held * ranks / r['num_samples']:.2f} |"
        )
    out += [
        "",
        "| samples | ranks | slowest rank's plan | largest rank's bytes held | x world / N |",
        "|--:|--:|--:|--:|--:|",
    ]
    for n in dict.fromkeys(r["num_samples"] for r in rows):
        for sharded in (False, True):
            mine = [r for r in rows if r["num_samples"] == n and r["sharded"] == sharded and "error" not in r]
            if mine:
                ranks = mine[0]["world"] if sharded else 1
                held = max(r["score_bytes"] + r["plan_bytes"] for r in mine)
                out.append(
                    f"| {n:,} | {ranks} | {max(r['plan_s'] for r in mine) * 1e3:,.1f} ms "
                    f"| {held / 2**20:,.1f} MiB | {held * ranks / n:.2f} |"
                )
    pol = rows[0].get("policy", "infobatch") if rows else "infobatch"
    out.append(
        f"\npolicy {pol}; exponential scores; best of the repeats per rank; ranks simulated in one process, "
        "in turns (each rank's time is its own); bytes are tensors' nbytes between steps"
    )
    return "\n".join(out)
