"""Interleaving: the arms of a seed take turns, one epoch each, so a busy spell of a shared machine slows them alike.

Each arm's task runs in a thread of its own, but only one runs at a time: the arm holding the
turn trains until its next ``run.log`` (the end of an epoch), then hands the turn back and waits.
The next turn goes to the arm whose next epoch is the least far along its own training (by the
middle of that epoch, from its data's progress), so an arm half as long trains about every other
round, over the same span. A task that never calls ``run.log`` runs whole, in its turn.

Every arm keeps its own global random state (torch's, Python's, numpy's), saved when it hands the
turn on and restored when it takes it, so an arm trains as it would alone, whatever ran between
its epochs. Ctrl-C stops the arm that is running (an exception raised in its thread) and the
waiting ones, and propagates; a task that raises ends its arm only: its error is returned beside
the other arms' results.

Example:
    >>> from leanbatch.arms.methods import parse_methods
    >>> from leanbatch.engine.running.run import Run
    >>> turns = []
    >>> def task(run):
    ...     ds = run.wrap(list(range(8)), 2)
    ...     for epoch in range(2):
    ...         ds.set_epoch(epoch)
    ...         idx = torch.tensor(list(ds.sampler))
    ...         ds.update(torch.ones(len(idx)), idx)
    ...         turns.append((run.label, epoch))
    ...         run.log(epoch=epoch, metric=float(epoch))
    ...     return 1.0
    >>> [(run.label, record.metric) for run, record in take_turns(task, [Run(a, 0) for a in parse_methods("baseline,random")])]
    [('baseline', 1.0), ('random', 1.0)]
    >>> turns
    [('baseline', 0), ('random', 0), ('baseline', 1), ('random', 1)]
"""

from __future__ import annotations

import ctypes
import random
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from leanbatch.engine.running.data import StudyError
from leanbatch.engine.running.run import Run

__all__ = ["Stopped", "take_turns"]


class Stopped(BaseException):
    """Raised in an arm's thread to stop it (Ctrl-C in the main thread)."""


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(state["numpy"])


class _Arm:
    """One arm's thread and its half of the turn-taking."""

    def __init__(self, task: Callable[[Run], Any], run: Run, rng: dict[str, Any], yielded: threading.Event):
        self.run, self.task, self.rng, self.yielded = run, task, rng, yielded
        self.go, self.done, self.stop = threading.Event(), False, False
        self.outcome: Any = None
        self.estimate = (0.0, 0.0)  # progress at the last two turns' ends: the next epoch's middle
        run.turn = self._hand_on
        self.thread = threading.Thread(target=self._body, name=f"leanbatch arm {run.label}", daemon=True)

    def _take(self) -> None:
        self.go.wait()
        self.go.clear()
        if self.stop:
            raise Stopped()
        _set_rng_state(self.rng)

    def _hand_on(self) -> None:
        self.rng = _rng_state()
        last = self.estimate[1]
        self.estimate = (last, self.run.progress or last + 1.0)
        self.yielded.set()
        self._take()

    def _body(self) -> None:
        try:
            self._take()
            self.run.clock.resume()
            self.outcome = self.run.finish(self.task(self.run))
        except (Stopped, KeyboardInterrupt):  # stopped by the main thread's Ctrl-C (or raised in the task)
            self.outcome = Stopped()
        except BaseException as e:  # the arm failed: its error is its outcome; the others go on
            self.outcome = e
        finally:
            self.run.clock.pause()
            self.done = True
            self.yielded.set()

    def next_middle(self) -> float:
        before, now = self.estimate
        return now + (now - before) / 2


def _stop_all(arms: list[_Arm]) -> None:
    """Stop every arm: raise :class:`Stopped` in its thread if it runs, release it if it waits."""
    for arm in arms:
        arm.stop = True
        if arm.thread.ident is not None and not arm.done:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(arm.thread.ident), ctypes.py_object(Stopped)
            )
        arm.go.set()
    for arm in arms:
        arm.thread.join(timeout=30.0)
        if not arm.done:
            arm.outcome = Stopped()


def take_turns(
    task: Callable[[Run], Any],
    runs: list[Run],
    whole: bool = False,
    on_done: Callable[[Run, Any], None] = lambda run, outcome: None,
) -> list[tuple[Run, Any]]:
    """Run ``task`` once per run, in turns (``whole``: each run to its end before the next); each
    run with its outcome: its :class:`~leanbatch.engine.judging.records.RunRecord`, or the exception it
    raised, or :class:`Stopped` when Ctrl-C or another arm's
    :class:`~leanbatch.engine.running.data.StudyError` stopped it (then every unfinished arm is stopped).
    ``on_done(run, outcome)``: once per run, as it ends (before the next turn), the stopped ones last;
    after Ctrl-C, KeyboardInterrupt is raised again once they are all out."""
    yielded = threading.Event()
    start = _rng_state()
    arms = [_Arm(task, run, start, yielded) for run in runs]
    for arm in arms:
        arm.thread.start()
    current: _Arm | None = None
    reported: set[int] = set()
    interrupted = False
    try:
        while not all(a.done for a in arms):
            live = [a for a in arms if not a.done]
            current = current if whole and current in live else min(live, key=_Arm.next_middle)
            yielded.clear()
            current.go.set()
            while not yielded.wait(0.2):  # a timeout: Ctrl-C reaches the main thread while it waits
                pass
            if current.done and not isinstance(current.outcome, Stopped):
                reported.add(id(current))
                on_done(current.run, current.outcome)
            if isinstance(current.outcome, Stopped):
                raise KeyboardInterrupt  # the arm was interrupted: stop the others as Ctrl-C would
            if isinstance(current.outcome, StudyError):
                _stop_all(arms)  # a breach every arm shares: the others stop where they stand
                break
    except KeyboardInterrupt:
        _stop_all(arms)
        interrupted = True
    finally:
        _set_rng_state(start)
    for a in arms:
        if id(a) not in reported:
            on_done(a.run, a.outcome)
    if interrupted:  # Ctrl-C, after every run's outcome is out (it may have come while one was recorded)
        raise KeyboardInterrupt
    return [(a.run, a.outcome) for a in arms]
