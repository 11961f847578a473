"""The running room: the run contract (:mod:`~leanbatch.engine.running.run`), the arm's data
(:mod:`~leanbatch.engine.running.data`), the selection hook, the frameworks' wiring, the
contract's checks, what a run counts, the arms' turns and a study's training
(:mod:`~leanbatch.engine.running.study`). Its product is one record per run
(:class:`~leanbatch.engine.judging.records.RunRecord`); judging them is the other room's.

Example:
    >>> import leanbatch.engine.running
"""
