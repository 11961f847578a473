"""One run of a study as a Ray Tune trial (:func:`trial`): the task under the contract, as in one process.

The trial builds the arm's :class:`~leanbatch.engine.running.run.Run`, calls the task, and hands its
outcome back to the driver in its last report: the run's record, or the line that says why it has
none (a task that raised, a breach every arm shares, a default method left out). A task that raises
is an outcome, not a failure of the trial, so Tune does not retry it; a worker process that dies is
a failure, and Tune retries the trial. Every ``run.log`` reports to Tune (the metric, the epoch, the
task's numbers, the work so far), so Tune's progress table and its loggers show each run's curve.

A run of ``workers`` processes (a ``torchrun``-style job) trains in the trial's placement group, one
bundle per process: each process gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` as under ``torchrun``, the task initialises its process group from them, and the
first process's run is the trial's (its logs reach Tune through a queue).

Example:
    >>> from leanbatch.arms.methods import parse_methods
    >>> spec = Spec(lambda run: 2.0, {a.label: a for a in parse_methods("baseline")})
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

from leanbatch.arms.methods import Arm
from leanbatch.engine.judging.journal import dumps
from leanbatch.engine.running.data import ContractError, HookMissing, StudyError
from leanbatch.engine.running.run import Run

__all__ = ["OUTCOME", "Spec", "run_one", "trial"]

OUTCOME = "leanbatch_outcome"  # the key of the last report: the run's outcome, for the driver


@dataclass
class Spec:
    """What every trial of a study shares: the ``task``, the ``arms`` by label, the metric's name and how
    the caller names it, whether the methods are the defaults (``optional``), the processes of one
    run (``workers``, each with ``resources``), torch's CPU threads (``threads``; None: Ray's)."""

    task: Callable[[Run], Any]
    arms: dict[str, Arm]
    metric: str = "metric"
    metric_option: str = "metric={!r}"
    optional: bool = False
    workers: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    threads: int | None = None


def _line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return first if isinstance(e, ContractError) else f"the task raised {type(e).__name__}: {first}"


def run_one(spec: Spec, label: str, seed: int, report: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run ``label`` at ``seed`` in this process, each ``run.log`` to ``report``: the outcome, plain values
    (``outcome``: ``run`` with its ``record`` as JSON, ``failed``, ``stopped`` or ``left_out`` with its
    ``error``)."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    arm = spec.arms[label]
    run = Run(arm, seed, spec.metric, lambda r: report(_logged(r, spec.metric)),
              metric_option=spec.metric_option, optional=spec.optional)  # fmt: skip
    try:
        run.clock.resume()
        record = run.finish(spec.task(run))
    except StudyError as e:
        return {"outcome": "stopped", "error": _line(e)}
    except HookMissing as e:
        return {"outcome": "left_out", "error": _line(e)}
    except Exception as e:  # the task's own error: reported once, never retried
        return {"outcome": "failed", "error": _line(e)}
    finally:
        run.clock.pause()
    return {"outcome": "run", "record": dumps(record.as_dict())}


def _logged(run: Run, metric: str) -> dict[str, Any]:
    """What one ``run.log`` reports to Tune: the metric (when evaluated), the epoch, the task's numbers,
    the counts and the training time so far."""
    last = run.epochs[-1]
    values: dict[str, Any] = {"epoch": last.epoch, "train_time_s": last.train_time_s, **last.values}
    values.update(steps=sum(e.steps for e in run.epochs), forwarded=sum(e.forwarded for e in run.epochs),
                  backpropagated=sum(e.backpropagated for e in run.epochs))  # fmt: skip
    if last.metric is not None:
        values[metric] = last.metric
    return values


def trial(config: dict[str, Any], spec: Spec) -> None:
    """The function trainable: the run ``config["run"]`` names (``method``, ``seed``), its logs and its
    outcome reported to Tune. A worker lost in a run of several processes fails the trial (a retry)."""
    from ray import tune

    label, seed = config["run"]["method"], int(config["run"]["seed"])
    if spec.workers == 1:
        outcome = run_one(spec, label, seed, tune.report)
    else:
        outcome = _distributed(spec, label, seed, tune.report)
    tune.report({OUTCOME: json.dumps(outcome)})


def _free_port() -> tuple[str, int]:
    """This node's address and a port free on it (for the process group's rendezvous)."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), int(s.getsockname()[1])


def _rank(spec: Spec, label: str, seed: int, env: dict[str, str], queue: Any) -> dict[str, Any]:
    """One process of a distributed run: the ``torchrun`` environment set, the task run; rank 0 logs."""
    import torch.distributed as dist

    os.environ.update(env)
    try:
        return run_one(spec, label, seed, queue.put if env["RANK"] == "0" else lambda values: None)
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _distributed(
    spec: Spec, label: str, seed: int, report: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The run as ``spec.workers`` processes, one per bundle of the trial's placement group; rank 0's
    outcome (a lost process raises: the trial fails and Tune retries it)."""
    import ray
    from ray.util.placement_group import get_current_placement_group
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    if group is None:
        raise RuntimeError("a run of several workers trains in its trial's placement group, and it has none")

    def placed(fn: Any, index: int) -> Any:  # in bundle ``index``, in a process of its own
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        return ray.remote(max_calls=1, max_retries=0, num_cpus=spec.resources.get("cpu", 1.0),
                          num_gpus=spec.resources.get("gpu", 0.0))(fn).options(scheduling_strategy=strategy)  # fmt: skip

    nodes = ray.get([placed(_free_port, i).remote() for i in range(spec.workers)])
    (master, port), hosts = nodes[0], [host for host, _ in nodes]
    queue = Queue(actor_options={"num_cpus": 0})
    futures = []
    for i in range(spec.workers):
        env = {"RANK": str(i), "WORLD_SIZE": str(spec.workers), "LOCAL_RANK": str(hosts[:i].count(hosts[i])),
               "MASTER_ADDR": master, "MASTER_PORT": str(port)}  # fmt: skip
        futures.append(placed(_rank, i).remote(spec, label, seed, env, queue))
    pending = list(futures)
    while pending:
        _, pending = ray.wait(pending, timeout=0.5)
        while not queue.empty():
            report(queue.get())
    outcomes = ray.get(futures)  # a process that died raises here
    while not queue.empty():
        report(queue.get())
    return outcomes[0]
