"""One run of a study as a Ray Tune trial (:func:`trial`): the task under the contract, as in one process.

The trial builds the arm's :class:`~leanbatch.engine.running.run.Run`, calls the task, and hands its
outcome back to the driver in its last report: the run's record, or the line that says why it has
none (a task that raised, a breach every arm shares, a default method left out). A task that raises
is an outcome, not a failure of the trial, so Tune does not retry it; a worker process that dies is
a failure, and Tune retries the trial. Every ``run.log`` reports to Tune (the metric, the epoch, the
task's numbers, the work so far), so Tune's progress table and its loggers show each run's curve.

A run of ``workers`` processes (a ``torchrun``-style job) trains in the trial's placement group, one
bundle per process: each process gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` as under ``torchrun`` (they meet at a ``TCPStore`` the trial hosts), the task
initialises its process group from them, and the first process's run is the trial's (its logs reach
Tune through the store as it trains).

Example:
    >>> from leanbatch.arms.methods import parse_methods
    >>> spec = Spec(Study(lambda run: 2.0, parse_methods("baseline"), [0]))
    >>> outcome = run_one(spec, "baseline", 0, report=lambda values: None)
    >>> outcome["outcome"], json.loads(outcome["record"])["metric"]
    ('run', 2.0)
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from leanbatch.engine.judging.journal import dumps
from leanbatch.engine.running.data import HookMissing, StudyError
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.study import Study, error_line

__all__ = ["OUTCOME", "Spec", "run_one", "trial"]

OUTCOME = "leanbatch_outcome"  # the key of the last report: the run's outcome, for the driver


@dataclass
class Spec:
    """What every trial of a study shares: the ``study``, the processes of one run (``workers``, each
    with ``resources``), torch's CPU threads (``threads``; None: Ray's)."""

    study: Study
    workers: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    threads: int | None = None


def run_one(spec: Spec, label: str, seed: int, report: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run ``label`` at ``seed`` in this process, each ``run.log`` to ``report``: the outcome, plain values
    (``outcome``: ``run`` with its ``record`` as JSON, ``failed``, ``stopped`` or ``left_out`` with its
    ``error``)."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    study = spec.study
    arm = next(a for a in study.arms if a.label == label)
    run = study.new_run(arm, seed, lambda r: report(_logged(r, study.metric)))
    try:
        run.clock.resume()
        record = run.finish(study.task(run))
    except StudyError as e:
        return {"outcome": "stopped", "error": error_line(e)}
    except HookMissing as e:
        return {"outcome": "left_out", "error": error_line(e)}
    except Exception as e:  # the task's own error: reported once, never retried
        return {"outcome": "failed", "error": error_line(e)}
    finally:
        run.clock.pause()
    return {"outcome": "run", "record": dumps(record.as_dict())}


def _logged(run: Run, metric: str) -> dict[str, Any]:
    """What one ``run.log`` reports to Tune: the metric (when evaluated), the epoch, the task's numbers,
    the counts and the training time so far."""
    last = run.epochs[-1]
    values: dict[str, Any] = {"epoch": last.epoch, "train_time_s": last.train_time_s, **last.values}
    values.update(
        {k: sum(getattr(e, k) for e in run.epochs) for k in ("steps", "forwarded", "backpropagated")}
    )
    if last.metric is not None:
        values[metric] = last.metric
    return values


def trial(config: dict[str, Any], spec: Spec) -> None:
    """The function trainable: the run ``config["run"]`` names (``method``, ``seed``), its logs and its
    outcome reported to Tune. A worker lost in a run of several processes fails the trial (a retry)."""
    from ray import tune

    label, seed = config["run"]["method"], int(config["run"]["seed"])
    outcome = (run_one if spec.workers == 1 else _distributed)(spec, label, seed, tune.report)
    tune.report({OUTCOME: json.dumps(outcome)})


def _rank(spec: Spec, label: str, seed: int, rank: int, store: tuple[str, int]) -> dict[str, Any]:
    """One process of a distributed run: the ``torchrun`` environment set (rank 0 publishes its address
    through the trial's store, the others read it), the task run; rank 0's logs go to the store."""
    import ray
    import torch.distributed as dist

    client = dist.TCPStore(store[0], store[1], is_master=False)
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            client.set("master", f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}")
    host, _, port = client.get("master").decode().rpartition(":")
    local = client.add(f"host/{host}", 1) - 1  # this process's place among the run's processes on its node
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(spec.workers), LOCAL_RANK=str(local), MASTER_ADDR=host,
                      MASTER_PORT=port)  # fmt: skip

    def log(values: dict[str, Any]) -> None:
        client.set(f"log/{client.add('logs', 1) - 1}", json.dumps(values))

    try:
        return run_one(spec, label, seed, log if rank == 0 else lambda values: None)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _distributed(
    spec: Spec, label: str, seed: int, report: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The run as ``spec.workers`` processes, one per bundle of the trial's placement group, meeting at a
    store this trial hosts; rank 0's outcome (a lost process raises: the trial fails, Tune retries it)."""
    import ray
    import torch.distributed as dist
    from ray.util.placement_group import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    if group is None:
        raise RuntimeError("a run of several workers trains in its trial's placement group, and it has none")
    store = dist.TCPStore(ray.util.get_node_ip_address(), 0, is_master=True, wait_for_workers=False)
    bundle = dict(spec.resources)
    cpus, gpus = bundle.pop("CPU", 0.0), bundle.pop("GPU", 0.0)
    futures = [
        ray.remote(_rank).options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
            num_cpus=cpus, num_gpus=gpus, resources=bundle, max_retries=0,
        ).remote(spec, label, seed, i, (ray.util.get_node_ip_address(), store.port))
        for i in range(spec.workers)
    ]  # fmt: skip
    pending, shown = list(futures), 0
    while pending:
        _, pending = ray.wait(pending, timeout=0.5)
        logged = int(store.add("logs", 0))  # rank 0's logs so far: report those not yet shown
        for n in range(shown, logged):
            report(json.loads(store.get(f"log/{n}")))
        shown = logged
    return ray.get(futures)[0]  # a process that died raises here
