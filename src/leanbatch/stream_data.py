"""The stream a loader reads: each item's fate decided as it arrives, before collation and training.

:class:`PrunedStream` is the ``IterableDataset`` :class:`~leanbatch.StreamInfoBatch` hands the
``DataLoader`` (its ``.dataset``). Each ``iter()`` reads one pass of the user's stream (a
re-iterable, an ``IterableDataset`` such as a Hugging Face streaming dataset, or a generator
function), in blocks of :data:`BLOCK` items: the block's keys are read, its fates decided at once
by the pass's :class:`~leanbatch.stream_pass.StreamPass` (vectorised), the kept items
transformed (``transform=``) and yielded; the dropped ones cost their reading only.

**Workers.** A worker process decides with the pass it was given when it started: a DataLoader
without ``persistent_workers`` starts its workers at each ``iter(loader)``, after
``set_pass``, so each sees its pass (copied by fork, or pickled under spawn). Persistent workers
keep the pass they started with: refused, at the first batch of the second pass they read.
An ``IterableDataset`` splits itself between workers (torch's contract: Hugging Face's gives
each worker its own shards); any other iterable is read by every worker, which keeps every
``num_workers``-th item (round-robin), so no item is read into two batches.

**Resume.** The iterator is stateful in ``torchdata``'s sense (``state_dict``/``load_state_dict``,
what ``StatefulDataLoader`` saves per worker): the pass and how many items of this worker's
share were handled. An ``IterableDataset`` with its own ``state_dict`` (Hugging Face's) is
restored to the start of the block and the block's handled items skipped; any other stream is
read again from its start and the handled items skipped. Either way the items decide again the
same, since a fate depends only on the pass and the key.

Example:
    >>> import torch
    >>> from leanbatch.stream_pass import StreamPass
    >>> s = PrunedStream(lambda: ({"id": i} for i in range(4)), key="id")
    >>> s.current = StreamPass(1, 0, torch.tensor([2]), cut=(1 << 32) - 1)   # key 2 is dropped
    >>> [x["id"] for x in s]
    [0, 1, 3]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from leanbatch.keyed_scores import MAX_KEY
from leanbatch.stream_pass import StreamPass

__all__ = ["BLOCK", "PrunedStream"]

BLOCK = 256  # items read, keyed and decided together

KeySpec = str | int | Callable[[Any], Any]


class PrunedStream(IterableDataset):
    """The pruned view of ``source`` for the pass in :attr:`current` (set by its owner).

    Args:
        source: a re-iterable (an ``IterableDataset``, a list) or a function returning a fresh
            iterator (a generator function); not a one-shot iterator: each pass and each worker
            reads the stream anew.
        key: where an item's key is: a field name (``item[key]``, e.g. ``"id"``), a position
            (``item[0]``), or a function of the item. With a function, items come as
            ``(item, key)`` so the batch carries its keys; otherwise unchanged.
        transform: applied to the kept items only (after the decision), e.g. tokenisation.
    """

    def __init__(self, source: Any, key: KeySpec, transform: Callable[[Any], Any] | None = None):
        if isinstance(source, Iterator):
            raise TypeError(
                "source is a one-shot iterator (a generator object): each pass, and each loader worker, "
                "reads the stream anew; pass the generator function itself (a callable returning a fresh "
                "iterator) or a re-iterable (an IterableDataset, a list)"
            )
        if not isinstance(source, Iterable) and not callable(source):
            raise TypeError(
                f"source must be an iterable or a function returning an iterator, got {type(source).__name__}"
            )
        if not (isinstance(key, (str, int)) and not isinstance(key, bool)) and not callable(key):
            raise TypeError(f"key must be a field name, a position or a function of the item, got {key!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a function of an item, got {transform!r}")
        self.source, self.key, self.transform = source, key, transform
        self.current = StreamPass.keep_all(0, 0)  # the owner sets the pass
        self.on_epoch: Callable[[int], None] | None = None  # the owner's set_pass (main process only)
        self._worker_read = False  # this copy was read in a worker process

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["on_epoch"] = None  # a worker never moves the pass (and need not carry the owner)
        return state

    def set_epoch(self, epoch: int) -> None:
        """What the Hugging Face Trainer and accelerate call each epoch: the owner's ``set_pass``."""
        if self.on_epoch is None:
            raise RuntimeError("set_epoch moves the pass of the StreamInfoBatch that made this stream")
        self.on_epoch(epoch)

    def __iter__(self) -> _PassIterator:
        return _PassIterator(self, self.current, get_worker_info())

    def keys_of(self, block: list[Any], first: int, info: Any = None) -> torch.Tensor:
        """The int64 keys of ``block`` (from item ``first`` of worker ``info``'s share: for the messages)."""
        share = "the stream" if info is None else f"worker {info.id}'s share of the stream"
        out = []
        for j, item in enumerate(block):
            try:
                k = self.key(item) if callable(self.key) else item[self.key]
            except Exception as e:
                raise _key_error(self.key, f"item {first + j} of {share}", e) from e
            if type(k) is not int:
                k = _as_int(k, self.key, f"item {first + j} of {share}")
            if not 0 <= k <= MAX_KEY:
                raise ValueError(
                    f"key: item {first + j} of {share} has key {k}: keys must be integers in [0, 2**63 - 1)"
                )
            out.append(k)
        return torch.tensor(out, dtype=torch.int64)


def _key_error(key: KeySpec, at: str, e: Exception) -> Exception:
    """The error for an item whose key could not be read (``at``: which item)."""
    if callable(key):
        return ValueError(
            f"key: the key function raised {type(e).__name__}: {e} on {at}; fix the function (it must "
            "return the item's integer key)"
        )
    return ValueError(
        f"key: {at} has no {key!r} ({type(e).__name__}: {e}): every item must carry its key (a stable "
        "integer id), or pass key= a function of the item that returns it"
    )


def _as_int(k: Any, key: KeySpec, at: str) -> int:
    """A numpy or 0-d tensor integer key as an int; anything else (bool, float, str) refused."""
    if isinstance(k, torch.Tensor) and k.dim() == 0 and not k.is_floating_point() and k.dtype != torch.bool:
        return int(k)
    if type(k).__module__ == "numpy" and hasattr(k, "dtype") and k.dtype.kind in "iu":
        return int(k)
    raise TypeError(
        f"key: {at} has key {k!r} ({type(k).__name__}) from key={key!r}: keys must be integers (an id), "
        "not booleans, floats or strings; hash a string id to an integer in your key function"
    )


class _PassIterator:
    """One pass of one worker's share of the stream; stateful for ``torchdata.StatefulDataLoader``."""

    def __init__(self, stream: PrunedStream, plan: StreamPass, info: Any):
        self._stream, self._plan, self._info = stream, plan, info
        self._handled = 0  # items of this share handled (yielded or dropped) before the last yield
        self._block_state: Any = None  # the source's own state at the block's start (stateful sources)
        self._block_start = 0
        self._resume: dict[str, Any] | None = None
        self._items: Iterator[Any] | None = None
        src = stream.source
        self._stateful = isinstance(src, IterableDataset) and all(
            hasattr(src, m) for m in ("state_dict", "load_state_dict")
        )

    def __iter__(self) -> _PassIterator:
        return self

    def __next__(self) -> Any:
        if self._items is None:
            self._items = self._run()
        return next(self._items)

    def state_dict(self) -> dict[str, Any]:
        return {
            "pass": self._plan.index,
            "handled": self._handled,
            "source": self._block_state,
            "block_start": self._block_start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("pass") != self._plan.index:
            got = state.get("pass") if isinstance(state, dict) else state
            raise ValueError(
                f"the loader's state is of pass {got} but the stream is at pass {self._plan.index}: load "
                "the StreamInfoBatch's state_dict (saved with the loader's) before the loader's"
            )
        self._resume = state

    def _open(self) -> Iterator[Any]:
        """This worker's share of the source, positioned after the items handled before a resume."""
        src, resume, skip = self._stream.source, self._resume, 0
        if resume is not None:
            self._handled = skip = resume["handled"]
            if resume["source"] is not None and self._stateful:
                src.load_state_dict(resume["source"])
                skip -= resume["block_start"]
        items = iter(src if isinstance(src, Iterable) else src())
        info = self._info
        if info is not None and info.num_workers > 1 and not isinstance(src, IterableDataset):
            items = itertools.islice(items, info.id, None, info.num_workers)  # round-robin share
        next(itertools.islice(items, skip, skip), None)  # skip the handled: block states are read after
        return items

    def _run(self) -> Iterator[Any]:
        stream = self._stream
        if self._info is not None:
            if stream._worker_read:
                raise RuntimeError(
                    "persistent_workers=True: a persistent worker keeps the pass it started with, so it would "
                    "decide this pass with the last pass's frozen scores; build the DataLoader with "
                    "persistent_workers=False (workers then start at each pass, after set_pass)"
                )
            stream._worker_read = True
        items = self._open()
        while True:
            if self._stateful:
                self._block_state, self._block_start = stream.source.state_dict(), self._handled
            block = list(itertools.islice(items, BLOCK))
            if not block:
                return
            start = self._handled
            keys = stream.keys_of(block, start, self._info)
            kept = self._plan.fates(keys)[0].tolist()
            for j, (item, key, keep) in enumerate(zip(block, keys.tolist(), kept, strict=True)):
                if keep:
                    self._handled = start + j + 1
                    out = item if stream.transform is None else stream.transform(item)
                    yield (out, key) if callable(stream.key) else out
            self._handled = start + len(block)
