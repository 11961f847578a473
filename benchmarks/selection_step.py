"""The Python work of one batch-level selection step: calls into leanbatch, argument checks, time.

Three steps in steady state (a few steps have run before), a batch of 64 rows of a 4,096-sample
set, ``keep=0.5``:

- **online selection**: ``obs.select(batch, progress=, batch_idx=, indices=)`` and
  ``obs.record_losses(...)`` (``OnlineBatchSelection``, pressure decaying 100 -> 1);
- **Selective Backprop**: ``sb.select(batch, model, F.cross_entropy, progress=, batch_idx=)``
  (the rank rule, no downsampling, a linear model);
- **RHO-LOSS**: ``rho.select(batch, model, F.cross_entropy, progress=, batch_idx=, indices=)``.

For each step it counts (``sys.setprofile``) the Python functions of the ``leanbatch`` package
that run, and of those the argument checks (``check_*``, ``num_selected``, ``pressure_at``,
``resolve_generator``, ``rankable_losses``); with ``--time`` also the median microseconds per
step over ``--repeats`` runs of ``--time`` steps, on one thread. Only public names are used, so
the same script measures any commit (run it with that commit's interpreter and package)::

    python benchmarks/selection_step.py                       # counts: deterministic, no timing
    python benchmarks/selection_step.py --time 2000           # and microseconds per step
    /work/base/.venv/bin/python benchmarks/selection_step.py --time 2000   # another checkout
    python benchmarks/selection_step.py --json

Time it on a quiet machine, the two checkouts one after the other in the same session.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

N, B = 4096, 64
CHECKS = ("num_selected", "pressure_at", "resolve_generator", "rankable_losses")


def counted(step: Callable[[], Any]) -> tuple[int, int]:
    """Calls of ``leanbatch`` functions while ``step()`` runs, and how many of them were checks."""
    seen: Counter[bool] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and str(frame.f_globals.get("__name__", "")).startswith("leanbatch"):
            name = frame.f_code.co_name
            seen[name.startswith("check_") or name in CHECKS] += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return seen[False] + seen[True], seen[True]


def steps() -> dict[str, Callable[[int], None]]:
    """One step function per method, ``step(i)`` on batch ``i % 8``."""
    from leanbatch import OnlineBatchSelection, SelectiveBackprop
    from leanbatch.selection import RhoLoss

    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(8, B, 4, generator=g), torch.randint(0, 3, (8, B), generator=g)
    batches = [(xs[t], ys[t], torch.randperm(N, generator=g)[:B]) for t in range(8)]
    model = torch.nn.Linear(4, 3)
    obs = OnlineBatchSelection(num_samples=N, keep=0.5, pressure=100.0, final_pressure=1.0, seed=0)
    sb = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, scale_factor=1.0, interrupt=0, seed=0)
    rho = RhoLoss(torch.zeros(N), keep=0.5, seed=0)

    def online(i: int) -> None:
        x, y, idx = batches[i % 8]
        sel = obs.select((x, y), progress=0.5, batch_idx=i, indices=idx)
        xs, ys = sel.batch
        obs.record_losses(idx[sel.positions], F.cross_entropy(model(xs), ys, reduction="none").detach())

    def selective_backprop(i: int) -> None:
        x, y, _ = batches[i % 8]
        sb.select((x, y), model, F.cross_entropy, progress=0.5, batch_idx=i)

    def rho_loss(i: int) -> None:
        x, y, idx = batches[i % 8]
        rho.select((x, y), model, F.cross_entropy, progress=0.5, batch_idx=i, indices=idx)

    return {"online selection": online, "Selective Backprop": selective_backprop, "RHO-LOSS": rho_loss}


def measure(time_steps: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per step: leanbatch calls, checks among them and (``time_steps > 0``) median microseconds."""
    out: dict[str, dict[str, float]] = {}
    for name, step in steps().items():
        for i in range(4):  # steady state
            step(i)
        calls, checks = counted(lambda step=step: step(4))
        row: dict[str, float] = {"calls": calls, "checks": checks}
        if time_steps:
            runs = []
            with torch.no_grad():
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for i in range(time_steps):
                        step(i)
                    runs.append((time.perf_counter() - t0) / time_steps * 1e6)
            row["us_per_step"] = statistics.median(runs)
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--time", type=int, default=0, metavar="STEPS", help="also time STEPS steps (0: counts only)"
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per step; the median is reported")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import leanbatch

    result = measure(args.time, args.repeats)
    if args.json:
        print(json.dumps({"package": leanbatch.__file__, "steps": result}, indent=2))
        return
    print(f"package: {leanbatch.__file__}\n")
    print("| step | leanbatch calls | of them checks |" + (" us per step |" if args.time else ""))
    print("|---|---:|---:|" + ("---:|" if args.time else ""))
    for name, row in result.items():
        tail = f" {row['us_per_step']:.1f} |" if args.time else ""
        print(f"| {name} | {row['calls']:.0f} | {row['checks']:.0f} |{tail}")


if __name__ == "__main__":
    main()
