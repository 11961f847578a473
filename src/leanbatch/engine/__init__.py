"""The engine: judge any training task against the envelope of plain baselines and the uniform twins.

A *task* is a function ``train(run) -> metric`` (:mod:`~leanbatch.engine.run` has the loop); the
engine runs it once per *arm* (a method, a budget: :mod:`~leanbatch.arms.methods`) and seed, the
arms of a seed taking turns epoch by epoch (:mod:`~leanbatch.engine.interleave`), on a clock of
training time only, and judges every arm against the envelope
(:mod:`~leanbatch.engine.envelope`) and its uniform twin (:mod:`~leanbatch.engine.controls`) by
one rule (:mod:`~leanbatch.engine.verdicts`). It knows nothing of images: the built-in image task
(:mod:`leanbatch.tasks.images`) is one task among others.

Example:
    >>> from leanbatch.engine import Report, Run, bench
    >>> callable(bench), Run.__name__, issubclass(Report, dict)
    (True, 'Run', True)
"""

from leanbatch.engine.data import Budget, ContractError, KeepAll
from leanbatch.engine.run import Run
from leanbatch.engine.selecting import Pick
from leanbatch.engine.study import Report, bench

__all__ = ["Budget", "ContractError", "KeepAll", "Pick", "Report", "Run", "bench"]
