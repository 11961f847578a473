"""The contract's checks: a task that can be called (:func:`load_task`, :func:`task_identity`) and arms
that trained their budget (:func:`check_trained`), each refusal a
:class:`~leanbatch.engine.running.data.ContractError` (or :class:`TaskError`) of one line.

Example:
    >>> try:
    ...     load_task("no/such/file.py:train")
    ... except TaskError as e:
    ...     print(e)
    --task no/such/file.py: no such file
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leanbatch import InfoBatch
from leanbatch.arms.methods import Arm
from leanbatch.engine.running.data import ContractError, CountedInfoBatch
from leanbatch.engine.running.tally import served
from leanbatch.selection import Selector

__all__ = ["TaskError", "check_trained", "load_task", "task_identity"]

_FILE_TASK = "leanbatch_task_"  # the module name a task loaded from a file is given, before its path's hash


class TaskError(ValueError):
    """A ``--task`` that cannot be loaded or called: one line naming it and the fix."""


def load_task(spec: str) -> Callable[[Any], Any]:
    """The task function ``spec`` names: ``FILE.py:NAME`` or ``MODULE:NAME`` (``NAME`` defaults to ``train``),
    checked to be a function of one argument, the run."""
    where, _, name = spec.rpartition(":") if ":" in spec else (spec, "", "train")
    name = name or "train"
    try:
        if where.endswith(".py") or "/" in where:
            path = Path(where)
            if not path.is_file():
                raise TaskError(f"--task {where}: no such file")
            mod_name = f"{_FILE_TASK}{abs(hash(str(path.resolve())))}"
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            sys.path.insert(0, str(path.resolve().parent))  # the task's own helpers beside it
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except TaskError:
        raise
    except ModuleNotFoundError as e:
        raise TaskError(f"--task {spec}: cannot import {e.name!r} ({e})") from None
    except Exception as e:  # the task's module failed while it loaded
        raise TaskError(f"--task {spec}: loading it raised {type(e).__name__}: {e}") from None
    task = getattr(module, name, None)
    if task is None:
        raise TaskError(f"--task {spec}: {where} has no {name!r} (write FILE.py:FUNCTION or MODULE:FUNCTION)")
    check_callable(task, f"--task {spec}")
    return task


def check_callable(task: Any, what: str) -> None:
    """Refuse what cannot be called as ``task(run)``."""
    if not callable(task):
        raise TaskError(
            f"{what} is a {type(task).__name__}, not a function: the task is train(run) -> metric"
        )
    try:
        inspect.signature(task).bind(object())
    except TypeError:
        raise TaskError(
            f"{what} takes {inspect.signature(task)}: a task takes one argument, the run (def train(run): ...)"
        ) from None
    except ValueError:  # a builtin without a signature: accept
        pass


def task_identity(task: Any) -> dict[str, str | None]:
    """What tells one task from another in results.json: its module, its function (a callable
    object's class) and the SHA-256 of its source file (None where it has none).
    """
    obj = task if inspect.isfunction(task) or inspect.ismethod(task) else type(task)
    name = getattr(obj, "__module__", None) or ""
    module = sys.modules.get(name)
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:  # a builtin
        source = None
    sha = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source and Path(source).is_file() else None
    file = getattr(module, "__file__", None) if name.startswith(_FILE_TASK) else None
    return {"module": Path(file).stem if file else name, "function": obj.__qualname__, "sha256": sha}


def check_trained(
    arm: Arm, data: Any, selector: Selector | None, total_steps: Callable[[], int | None]
) -> None:
    """Raise :class:`ContractError` unless ``arm`` trained what its ``data``, its ``selector`` and its
    ``total_steps`` say (the engine names the arm and the seed before the message). What a step
    shows (its size, samples never served, a budget's epochs) was checked as it trained."""
    if data is None:
        if arm.prunes or arm.limited:
            raise ContractError(
                "the task never called run.wrap(dataset, num_epochs) (or run.callback / run.trainer), so the "
                "arm's method and budget were never applied"
            )
        return
    if arm.selects and (selector is None or selector.stats.batches == 0):
        raise ContractError("the task never called run.select(...), the batch-level selection hook")
    counts = data.counts
    if isinstance(data, InfoBatch) and counts.rows > (n := served(data, arm.limited)):
        raise ContractError(
            f"trained {counts.rows} samples but its data served {n}: pass sampler=ds.sampler to the "
            "DataLoader (not shuffle=True)"
        )
    if isinstance(data, CountedInfoBatch) and data.budget is not None and data.budget.limited:
        began = data.served
        unserved = any(e not in began and data.to_serve(e) > 0 for e in range(data.num_epochs))
    else:
        unserved = isinstance(data, InfoBatch) and not arm.limited and len(data.epoch_stats) < data.num_epochs
    if unserved:
        raise ContractError(
            f"not every one of its {data.num_epochs} epochs was served: iterate ds.sampler (DataLoader(ds, "
            "sampler=ds.sampler)) in every epoch, for range(ds.epoch, ds.num_epochs)"
        )
    total = total_steps() if arm.limited else None
    if total is not None and counts.steps != total:
        raise ContractError(
            f"trained {counts.steps} steps, not the {total} its budget says: train on DataLoader(ds, "
            "batch_size=run.batch_size(B), sampler=ds.sampler) for range(ds.epoch, ds.num_epochs)"
        )
