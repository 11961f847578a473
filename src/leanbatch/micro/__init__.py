"""Micro-benchmarks of the library's own overheads: ``leanbatch micro plan|update|select``.

:mod:`~leanbatch.micro.overheads` times planning one pruning epoch, ``InfoBatch.update()`` and
Selective Backprop's selection pass; :mod:`~leanbatch.micro.sharded` plans sharded scores per
simulated rank (``leanbatch micro plan --world W --shard``).

Example:
    >>> from leanbatch.micro import overheads, sharded
"""
