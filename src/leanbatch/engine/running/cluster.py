"""A study's runs as Ray Tune trials, on as many machines as a Ray cluster has (:func:`run_on_ray`).

Every (arm, seed) run is one trial of the user's task (:mod:`~leanbatch.engine.running.trial`), with
the resources of :class:`Cluster` (``--run-resources cpu=4,gpu=1``), or a placement group of
``workers`` bundles for a run that is itself a distributed job. The driver keeps the study's books as
trials end: each finished run is handed to ``on_run`` (the journal, the line on the terminal) and
``on_seed`` (results.json saved) at once; a run whose worker dies is retried (``retries``), a task
that raises is reported once and the others go on, and a breach every arm shares stops the study.
The runs are judged at equal work, so a run is comparable wherever it trained; its wall-clock is
measured where it ran.

Ray is the ``ray`` extra (``pip install "leanbatch[ray]"``); nothing here imports it before a study
runs on it.

Example:
    >>> parse_resources("cpu=4,gpu=1")
    {'CPU': 4.0, 'GPU': 1.0}
    >>> Cluster(address="auto").workers, Cluster().retries
    (1, 1)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leanbatch.engine.judging.records import RunRecord
from leanbatch.engine.running.study import Outcome, Study
from leanbatch.engine.running.trial import OUTCOME, Spec, trial

__all__ = ["Cluster", "ClusterError", "parse_resources", "run_on_ray"]

EXTRA = 'pip install "leanbatch[ray]"'


class ClusterError(ValueError):
    """A Ray option that cannot work (no Ray, no cluster at the address, bad resources): one line."""


def parse_resources(text: str) -> dict[str, float]:
    """``--run-resources``: ``cpu=4,gpu=1`` and any custom resource of the cluster (``name=amount``),
    as a placement-group bundle; :class:`ClusterError` of one line otherwise.

    Example:
        >>> try:
        ...     parse_resources("cpu=four")
        ... except ClusterError as e:
        ...     print(e)
        --run-resources takes name=amount pairs (cpu=4,gpu=1), got 'cpu=four'
    """
    pairs: list[tuple[str, float]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, amount = (x.strip() for x in part.partition("="))
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        pairs.append((name.upper() if name.lower() in ("cpu", "gpu") else name, value))
    if not pairs or not all(name and 0 <= value < float("inf") for name, value in pairs):
        raise ClusterError(f"--run-resources takes name=amount pairs (cpu=4,gpu=1), got {text!r}")
    return dict(pairs)


@dataclass
class Cluster:
    """Where and how a study's runs train on Ray: ``address`` (None: a local Ray instance started here;
    ``auto``, ``host:port`` or ``ray://host:port``: an existing cluster), each run's ``resources``
    (a bundle: ``{"CPU": 1}`` by default), ``workers`` processes per run (a distributed run),
    ``retries`` of a run whose worker dies, Tune's ``storage`` folder (its logs, TensorBoard, CSV),
    torch's CPU ``threads`` in each run (None: Ray's, the run's CPUs), Tune's ``verbose`` level, and
    Tune ``callbacks`` of your own (``MLflowLoggerCallback``, ``WandbLoggerCallback``...)."""

    address: str | None = None
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    workers: int = 1
    retries: int = 1
    storage: Path | None = None
    threads: int | None = None
    verbose: int = 1
    callbacks: list[Any] = field(default_factory=list)

    def check(self) -> None:
        """Refuse, before Ray starts, what cannot run (no Ray installed, bad counts): :class:`ClusterError`."""
        _ray()
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ClusterError(f"--run-workers must be an int >= 1, got {self.workers!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ClusterError(f"--retries must be an int >= 0, got {self.retries!r}")

    def placement(self, tune: Any) -> Any:
        """Each trial's placement group: one bundle, or an empty one for the trial and ``workers`` more."""
        head = [dict(self.resources)] if self.workers == 1 else [{}] + [dict(self.resources)] * self.workers
        return tune.PlacementGroupFactory(head, strategy="PACK")


def _ray() -> tuple[Any, Any]:
    """``ray`` and ``ray.tune``, or the extra named in one line."""
    try:
        import ray
        from ray import tune
    except ImportError as e:
        raise ClusterError(f"--ray needs Ray Tune, the ray extra: {EXTRA} ({e})") from None
    return ray, tune


def _connect(ray: Any, address: str | None) -> bool:
    """Join the cluster at ``address`` or start a local one; whether this call started Ray."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address or "local", log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise ClusterError(
            f"--ray {address}: no Ray cluster to join there ({first}): start one with ray start --head, "
            "or give --ray alone for a local one"
        ) from None
    return True


def _books(tune: Any, out: Outcome, on_run: Callable[[RunRecord], None], on_seed: Callable[[Outcome], None],
           retries: int) -> tuple[Any, Any]:  # fmt: skip
    """Tune's callback, which keeps the driver's books (each trial's outcome into ``out`` as it reports its
    last result, or fails), and its stopper (a breach stops every trial)."""
    ended: set[tuple[str, int]] = set()

    def first_end(trial: Any) -> tuple[str, int] | None:
        key = (trial.config["run"]["method"], int(trial.config["run"]["seed"]))
        if key in ended:  # a trial retried after it had reported: its first outcome stands
            return None
        ended.add(key)
        return key

    class Keep(tune.Callback):  # type: ignore[misc, name-defined]
        def on_trial_result(self, iteration: int, trials: Any, trial: Any, result: Any, **info: Any) -> None:
            if OUTCOME not in result or (key := first_end(trial)) is None:
                return
            outcome = json.loads(result[OUTCOME])
            kind, where = outcome["outcome"], {"method": key[0], "seed": key[1]}
            if kind == "run":
                record = RunRecord.from_dict(json.loads(outcome["record"]))
                out.runs.append(record)
                on_run(record)
                on_seed(out)
            elif kind == "stopped":
                out.stopped = {**where, "error": outcome["error"]}
            elif kind == "left_out":
                out.left_out += [] if key[0] in out.left_out else [key[0]]
            else:
                out.failed.append({**where, "error": outcome["error"]})
                on_seed(out)

        def on_trial_error(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            if (key := first_end(trial)) is None:
                return
            file = Path(trial.error_file) if trial.error_file else None
            text = file.read_text() if file and file.is_file() else trial.get_error()
            last = next((ln.strip() for ln in reversed((text or "").splitlines()) if ln.strip()), "no trace")
            error = f"its worker failed {retries + 1} time(s), the last: {last[:300]}"
            out.failed.append({"method": key[0], "seed": key[1], "error": error})

    class Breach(tune.Stopper):  # type: ignore[misc, name-defined]
        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            return False

        def stop_all(self) -> bool:
            return out.stopped is not None

    return Keep(), Breach()


def run_on_ray(
    study: Study,
    cluster: Cluster,
    on_run: Callable[[RunRecord], None] = lambda r: None,
    on_seed: Callable[[Outcome], None] = lambda o: None,
    kept: Sequence[RunRecord] = (),
) -> Outcome:
    """:func:`~leanbatch.engine.running.study.run_study` on a Ray cluster: every run not ``kept`` a Tune
    trial, ``on_run`` and ``on_seed`` as each ends (every ``run.log`` goes to Tune: its progress table and
    loggers show it). A default method left out is taken off ``study.arms``."""
    cluster.check()
    ray, tune = _ray()
    out = Outcome(runs=list(kept))
    done = {(r.method, r.seed) for r in kept}
    todo = [
        {"method": a.label, "seed": s} for s in study.seeds for a in study.arms if (a.label, s) not in done
    ]
    started = _connect(ray, cluster.address) if todo else False
    try:
        if todo:
            _fit(tune, study, cluster, out, todo, on_run, on_seed)
    except KeyboardInterrupt:
        out.interrupted = True
    finally:
        if started:
            ray.shutdown()
    ended = {(r.method, r.seed) for r in out.runs} | {(f["method"], f["seed"]) for f in out.failed}
    left = {(t["method"], t["seed"]) for t in todo} - ended
    out.interrupted = out.interrupted or (out.stopped is None and any(m not in out.left_out for m, _ in left))
    order = {a.label: i for i, a in enumerate(study.arms)}
    out.runs.sort(key=lambda r: (study.seeds.index(r.seed), order.get(r.method, len(order))))
    study.arms = [a for a in study.arms if a.label not in out.left_out]
    study.left_out = list(out.left_out)
    return out


def _fit(tune: Any, study: Study, cluster: Cluster, out: Outcome, todo: list[dict[str, Any]],
         on_run: Callable[[RunRecord], None], on_seed: Callable[[Outcome], None]) -> None:  # fmt: skip
    """One Tune experiment: a trial per run in ``todo``, its outcomes into ``out``."""
    from ray import cloudpickle

    task = study.task  # its own module travels with the trials (it may be a file only this machine has)
    module = sys.modules.get(getattr(task, "__module__", None) or type(task).__module__)
    file = getattr(module, "__file__", None) or ""
    if module is not None and module.__name__.split(".")[0] != "leanbatch" and "-packages" not in file:
        cloudpickle.register_pickle_by_value(module)
    spec = Spec(study, cluster.workers, dict(cluster.resources), cluster.threads)
    keep, breach = _books(tune, out, on_run, on_seed, cluster.retries)
    storage = None if cluster.storage is None else str(Path(cluster.storage).resolve())
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trial, spec=spec), cluster.placement(tune)),
        param_space={"run": tune.grid_search(todo)},
        tune_config=tune.TuneConfig(reuse_actors=True),  # one process trains run after run: no start-up each
        run_config=tune.RunConfig(
            name=f"leanbatch-{time.strftime('%Y%m%d-%H%M%S')}", storage_path=storage, callbacks=[keep, *cluster.callbacks],
            stop=breach, failure_config=tune.FailureConfig(max_failures=cluster.retries),
            verbose=cluster.verbose,
        ),
    )  # fmt: skip
    tuner.fit()
