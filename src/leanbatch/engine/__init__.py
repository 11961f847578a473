"""The engine: judge any training task against the envelope of plain baselines and the uniform twins.

Two rooms. **Running** (:mod:`~leanbatch.engine.running`): a *task* is a function
``train(run) -> metric`` (:mod:`~leanbatch.engine.running.run` has the loop); the engine runs it
once per *arm* (a method, a budget: :mod:`~leanbatch.arms.methods`) and seed, the arms of a seed
taking turns epoch by epoch (:mod:`~leanbatch.engine.running.turns`), each counting what it trained.
**Judging** (:mod:`~leanbatch.engine.judging`): from the runs' records, every arm against the
envelope (:mod:`~leanbatch.engine.judging.envelope`) and its uniform twin
(:mod:`~leanbatch.engine.judging.controls`) by one rule (:mod:`~leanbatch.engine.judging.verdicts`),
then the tables, the plots and the report. It knows nothing of images: the built-in image task
(:mod:`leanbatch.tasks.images`) is one task among others.

Example:
    >>> from leanbatch.engine import Report, Run, bench
    >>> callable(bench), Run.__name__, issubclass(Report, dict)
    (True, 'Run', True)
"""

from leanbatch.engine.judging.report import Report
from leanbatch.engine.running.cluster import Cluster
from leanbatch.engine.running.data import Budget, ContractError
from leanbatch.engine.running.run import Run
from leanbatch.engine.running.selecting import Pick
from leanbatch.engine.study import bench

__all__ = ["Budget", "Cluster", "ContractError", "Pick", "Report", "Run", "bench"]
