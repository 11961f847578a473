"""Distribution as a layer: how the scores and plans of several processes meet.

The score table (:mod:`leanbatch.scores`) and the policies (:mod:`leanbatch.policies`) are
written for one process. This package wraps them for a data-parallel job:

- :mod:`~leanbatch.distributed.exchange` - every rank stores every rank's rows each step
  (:class:`ScoreExchange`), and a merge averages what ranks wrote alone (:func:`merge_scores`);
- :mod:`~leanbatch.distributed.carrier` - the rows ride DDP's gradient all-reduce
  (:class:`ScoreCarrier`; :func:`carry_if_ddp` for the adapters);
- :mod:`~leanbatch.distributed.shards` - each rank holds its own slice of the scores and plans
  (:class:`ShardedScores`, ``InfoBatch(shard_scores=True)``);
- :mod:`~leanbatch.distributed.checkpoints` - a sharded run's checkpoints, gathered
  (:func:`gather_states`) and re-sharded for any world (:func:`shard_state`);
- :mod:`~leanbatch.distributed.collectives` - the collectives themselves;
- :mod:`~leanbatch.distributed.simulate` - several ranks in one process (measuring, testing).

Example:
    >>> from leanbatch.distributed import ScoreCarrier, gather_states, merge_scores, shard_state
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanbatch.distributed.carrier import ScoreCarrier, carry_if_ddp
    from leanbatch.distributed.checkpoints import gather_states, shard_state
    from leanbatch.distributed.exchange import ScoreExchange, merge_scores
    from leanbatch.distributed.shards import ShardedScores

_HOME = {
    "ScoreCarrier": "carrier",
    "ScoreExchange": "exchange",
    "ShardedScores": "shards",
    "carry_if_ddp": "carrier",
    "gather_states": "checkpoints",
    "merge_scores": "exchange",
    "shard_state": "checkpoints",
}
__all__ = [
    "ScoreCarrier",
    "ScoreExchange",
    "ShardedScores",
    "carry_if_ddp",
    "gather_states",
    "merge_scores",
    "shard_state",
]


def __getattr__(name: str) -> Any:
    """Each name imported from its home on first use, so ``import leanbatch`` loads no more of
    distribution than a run uses."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'leanbatch.distributed' has no attribute {name!r}")
    return getattr(import_module(f"leanbatch.distributed.{home}"), name)
