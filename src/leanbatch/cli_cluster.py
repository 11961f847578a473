"""``leanbatch bench``'s options of a study that resumes and runs on a Ray cluster (:func:`ray_options`),
and the :class:`~leanbatch.engine.running.cluster.Cluster` made of them (:func:`cluster_from`).

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> ray_options(parser)
>>> cluster_from(parser.parse_args(["--ray", "auto", "--run-resources", "cpu=2"]), Path("out")).resources
{'CPU': 2.0}
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanbatch.engine.running.cluster import Cluster

__all__ = ["cluster_from", "ray_options"]

_RAY = "every (arm, seed) run a Ray Tune trial: alone, on a Ray instance started here; with an address, on that cluster (auto, host:port, ray://host:port)"
_FRESH = "train every run again: without it, a study started again on the same --out (after a kill, a lost node or driver) keeps the finished runs recorded there (runs.jsonl) and trains only the rest"


def ray_options(b: Any, integer: Any = int) -> None:
    """The options: ``--fresh``, ``--ray [ADDRESS]``, ``--run-resources``, ``--run-workers``, ``--retries``
    (``integer``: the parser's reader of an integer)."""
    r = b.add_argument_group('resuming, and on a Ray cluster (pip install "leanbatch[ray]"; docs/ray.md)')
    r.add_argument("--fresh", action="store_true", help=_FRESH)
    r.add_argument("--ray", nargs="?", const="", metavar="ADDRESS", help=_RAY)
    r.add_argument(
        "--run-resources",
        help="each run's resources on the cluster, e.g. cpu=4,gpu=1 (and any custom resource; default cpu=1)",
    )
    r.add_argument(
        "--run-workers",
        type=integer,
        help="processes per run, each with --run-resources, for a distributed task (RANK, WORLD_SIZE, MASTER_ADDR set as by torchrun; default 1)",
    )
    r.add_argument(
        "--retries",
        type=integer,
        help="times a run whose worker or node dies is tried again (default 1); a task that raises is reported, not retried",
    )


def cluster_from(args: argparse.Namespace, out: Path) -> Cluster | None:
    """``--ray`` and its options as a :class:`~leanbatch.engine.running.cluster.Cluster` (None without
    ``--ray``); its options without it, or ``--ray`` under torchrun: a one-line
    :class:`~leanbatch.engine.running.cluster.ClusterError`."""
    from leanbatch.engine.running.cluster import Cluster, ClusterError, parse_resources

    if args.ray is None:
        given = [o for o in ("run_resources", "run_workers", "retries") if getattr(args, o) is not None]
        if given:
            raise ClusterError(
                f"--{given[0].replace('_', '-')} is an option of --ray: add --ray (docs/ray.md)"
            )
        return None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ClusterError(
            "--ray places the runs itself: start leanbatch bench --ray once, not under torchrun "
            "(--run-workers N for a distributed task)"
        )
    resources = parse_resources(args.run_resources) if args.run_resources else {"CPU": 1.0}
    retries = 1 if args.retries is None else args.retries
    threads, verbose = getattr(args, "threads", None), 0 if getattr(args, "no_progress", False) else 1
    return Cluster(
        args.ray or None, resources, args.run_workers or 1, retries, out / "tune", threads, verbose
    )
