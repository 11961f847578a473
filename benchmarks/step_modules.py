"""How many of leanbatch's modules one training step runs code in (``sys.setprofile``).

Two steps, each in steady state (a few steps have run before, so nothing is planned or built):

- **InfoBatch**: one batch served by a ``DataLoader(ds, sampler=ds.sampler)`` (the loader's
  ``next()``: the sampler's order, the dataset's ``__getitems__``) and its ``ds.update(loss)``;
  also ``update(loss, indices)`` on the next batch.
- **online selection**: ``obs.select(batch, progress=, batch_idx=, indices=)`` and
  ``obs.record_losses(...)``.

Every Python function called while the step runs is attributed to the module that defines it;
the modules of the ``leanbatch`` package are listed. Only public names are used, so the same
script measures any commit (run it with that commit's interpreter and package on the path)::

    python benchmarks/step_modules.py              # this checkout
    /work/base/.venv/bin/python benchmarks/step_modules.py   # another checkout's package
    python benchmarks/step_modules.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def modules_run(step: Callable[[], Any]) -> list[str]:
    """The ``leanbatch`` modules whose functions run while ``step()`` runs, sorted."""
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name == "leanbatch" or name.startswith("leanbatch."):
                seen.add(name)

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return sorted(seen)


def infobatch_steps() -> dict[str, list[str]]:
    from leanbatch import InfoBatch

    n, bs = 4096, 64
    data = TensorDataset(torch.randn(n, 4), torch.randint(0, 3, (n,)))
    ds = InfoBatch(data, num_epochs=4, prune_ratio=0.5, delta=0.75, seed=0)
    model = torch.nn.Linear(4, 3)
    loader = DataLoader(ds, batch_size=bs, sampler=ds.sampler)
    ds.set_epoch(0)
    for x, y in loader:  # epoch 0 scores every sample, so epoch 1 prunes
        ds.update(F.cross_entropy(model(x), y, reduction="none").detach())
    ds.set_epoch(1)
    it = iter(loader)
    for _ in range(3):  # steady state
        x, y = next(it)
        ds.update(F.cross_entropy(model(x), y, reduction="none").detach())
    out: dict[str, list[str]] = {}

    def implicit() -> None:
        x, y = next(it)
        ds.update(F.cross_entropy(model(x), y, reduction="none").detach())

    out["InfoBatch: next(loader) + update(loss)"] = modules_run(implicit)
    x, y = next(it)
    served = ds.next_indices(bs)

    def explicit() -> None:
        ds.update(F.cross_entropy(model(x), y, reduction="none").detach(), served)

    out["InfoBatch: update(loss, indices)"] = modules_run(explicit)
    return out


def selection_step() -> dict[str, list[str]]:
    from leanbatch import OnlineBatchSelection

    n, bs = 4096, 64
    obs = OnlineBatchSelection(num_samples=n, keep=0.5, pressure=100.0, seed=0)
    model = torch.nn.Linear(4, 3)
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(bs, 4, generator=g),
            torch.randint(0, 3, (bs,), generator=g),
            torch.randperm(n, generator=g)[:bs],
        )
        for _ in range(5)
    ]

    def step(i: int) -> None:
        x, y, idx = batches[i]
        sel = obs.select((x, y), progress=0.5, batch_idx=i, indices=idx)
        xs, ys = sel.batch
        loss = F.cross_entropy(model(xs), ys, reduction="none").detach()
        obs.record_losses(idx[sel.positions] if sel.positions is not None else idx, loss)

    for i in range(4):
        step(i)
    return {"online selection: select + record_losses": modules_run(lambda: step(4))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import leanbatch

    result = {**infobatch_steps(), **selection_step()}
    if args.json:
        print(json.dumps({"package": leanbatch.__file__, "steps": result}, indent=2))
        return
    print(f"package: {leanbatch.__file__}\n")
    print("| step | modules | which |")
    print("|---|---:|---|")
    for name, mods in result.items():
        print(f"| {name} | {len(mods)} | {', '.join(m.removeprefix('leanbatch.') for m in mods)} |")


if __name__ == "__main__":
    main()
