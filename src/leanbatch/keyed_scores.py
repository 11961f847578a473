"""The keyed score table: one score per stream key, for at most ``capacity`` keys.

A stream has no dataset index, so its samples are addressed by a stable key (an integer in
``[0, 2**63 - 1)`` that the item carries, or that a key function gives). :class:`KeyedScoreTable` is a
:class:`~leanbatch.scores.ScoreTable` whose rows are the slots of an open-addressing hash table
(linear probing, load at most 1/2): the keys and the pass each key was last stored in live on
the CPU, next to where the keys come from (the loader); the scores live with the rest of the
table, on the training device when the losses are there. A batch's keys are looked up and
inserted with a few vectorised rounds of probing (no Python loop over keys, no host-device
sync); its losses are then stored like any score table's, by row.

**Memory.** Fixed when the table is built, never grown: ``2 * capacity`` slots of an int64 key and
an int32 stamp on the CPU (24 bytes per key of capacity) and a float32 score on the table's
device (8 bytes per key of capacity; 16 with ``variance=True``), see :attr:`nbytes`.

**Past the capacity** the keys stored longest ago are forgotten: when a batch's new keys would
not fit, the table drops the oldest keys (smallest stamp first, then smallest key: the same
choice on every run) down to 7/8 of its capacity and rebuilds, so this happens at most once
every ``capacity / 8`` new keys. A forgotten key is a never-scored key again; for InfoBatch on a
stream that means it is kept with weight 1 (unbiased, only less pruned). :attr:`evicted` counts
them.

Example:
    >>> import torch
    >>> t = KeyedScoreTable(capacity=4)
    >>> t.update(torch.tensor([10, 2**40]), torch.tensor([0.5, 2.0]))
    >>> t.get(torch.tensor([2**40, 10, 3])).tolist()
    [2.0, 0.5, nan]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from leanbatch.checks import INTEGER_DTYPES, check_int, check_per_sample_loss, check_saved_tensor, require
from leanbatch.scores import ScoreTable

__all__ = ["MAX_KEY", "KeyedScoreTable", "check_keys"]

MAX_KEY = (1 << 63) - 2  # keys are in [0, MAX_KEY]; -1 marks an empty slot
_EMPTY = -1
_FIBONACCI = 0x9E3779B97F4A7C15 - (1 << 64)  # a key's home slot: Fibonacci hashing (the product's top bits)
_WINDOW = 8  # slots a lookup reads per key at once (nearly every key lies within 8 of its home)


def check_keys(keys: Any, name: str = "keys") -> Tensor:
    """``keys`` as a 1-D int64 CPU tensor of keys in ``[0, 2**63 - 1)`` (our own copy), or an error naming ``name``.

    Keys on a device are copied to the CPU, which waits for the device: pass them as the loader
    gives them (on the CPU).

    Example:
        >>> check_keys([3, 1]).tolist()
        [3, 1]
    """
    t = keys if isinstance(keys, Tensor) else torch.as_tensor(keys)
    if t.dim() != 1 or t.dtype not in INTEGER_DTYPES:
        raise TypeError(
            f"{name} must be a 1-D tensor of integer keys (one per sample), got {t.dtype} {tuple(t.shape)}: "
            "a stream's keys are integers the items carry (an id) or a key function returns"
        )
    t = t.to("cpu", torch.int64, copy=True)  # a copy: the caller's memory may change behind torch's back
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name} must be integers >= 0, got {int(t.min())}")
    return t


class KeyedScoreTable(ScoreTable):
    """One float32 score per stream key, for at most ``capacity`` keys (see the module docstring).

    ``update(keys, losses)`` and ``get(keys)`` address scores by key, so the table can serve
    wherever a :class:`~leanbatch.scores.ScoreTable` is read and written by index (e.g. as
    :class:`~leanbatch.OnlineBatchSelection`'s memory: ``score_table=``, with the batch's keys as
    its indices); its rows (:attr:`values`) are slots, found with :meth:`lookup`. Non-finite
    losses are skipped and counted, ``ema``/``variance`` as in ``ScoreTable``. ``clock`` is the
    stamp stored with every key written (the stream's pass; set by its owner): the oldest stamps
    are forgotten first.

    Example:
        >>> import torch
        >>> t = KeyedScoreTable(capacity=4)
        >>> t.update(torch.tensor([5, 6]), torch.tensor([1.0, 2.0]))
        >>> t.clock = 1
        >>> t.update(torch.tensor([7, 8]), torch.tensor([3.0, 4.0]))
        >>> t.update(torch.tensor([9]), torch.tensor([5.0]))   # full: the oldest key (5) goes, down to 7/8
        >>> t.get(torch.tensor([5, 6, 7, 9])).tolist(), t.evicted
        ([nan, 2.0, 3.0, 5.0], 1)
    """

    def __init__(
        self,
        capacity: int = 1 << 20,
        device: torch.device | str | None = None,
        ema: float | None = None,
        variance: bool = False,
    ):
        self.capacity = check_int(capacity, "capacity", 1)
        super().__init__(2 * self.capacity, device, ema, variance)
        self._keys = torch.full((self.rows,), _EMPTY, dtype=torch.int64)
        self._stamps = torch.full((self.rows,), -1, dtype=torch.int32)
        self._longest = 0  # the longest probe of any stored key: lookups probe no further
        self._window = torch.arange(_WINDOW)
        self.count = 0  # keys held
        self.evicted = 0  # keys forgotten to stay within the capacity
        self.clock = 0

    # ------------------------------------------------------------------ the index
    def lookup(self, keys: Tensor) -> Tensor:
        """The row of each key (int64 CPU keys, checked), ``-1`` where the table does not hold it.

        Example:
            >>> import torch
            >>> t = KeyedScoreTable(capacity=8)
            >>> t.update(torch.tensor([4]), torch.tensor([1.0]))
            >>> int(t.lookup(torch.tensor([4, 5]))[1])
            -1
        """
        home = self._home(keys)
        held = self._keys[home]  # most keys are at home: one read each
        hit = held == keys
        out = torch.where(hit, home, -1)
        go = ~hit & (held != _EMPTY)  # an empty slot ends a key's probe: not held
        if self._longest == 0 or not bool(go.any()):
            return out
        todo = torch.nonzero(go).squeeze(1)
        want, home = keys[todo], home[todo]
        for start in range(1, self._longest + 1, _WINDOW):  # no stored key lies past _longest
            pos = (home.unsqueeze(1) + (self._window + start)) % self.rows
            held = self._keys[pos]
            hit = held == want.unsqueeze(1)
            found = hit.any(1)
            out[todo[found]] = pos.gather(1, hit.to(torch.uint8).argmax(1, keepdim=True)).squeeze(1)[found]
            go = ~found & ~(held == _EMPTY).any(1)
            if not bool(go.any()):
                break
            todo, want, home = todo[go], want[go], home[go]
        return out

    def _home(self, keys: Tensor) -> Tensor:
        return (((keys * _FIBONACCI) >> 32) & 0xFFFFFFFF) % self.rows

    def _insert(self, keys: Tensor) -> Tensor:
        """Place distinct keys the table does not hold (there is room); returns their rows."""
        rows = torch.empty_like(keys)
        todo = torch.arange(keys.numel())
        pos, dist = self._home(keys), torch.zeros_like(keys)
        while todo.numel():
            free = self._keys[pos] == _EMPTY
            cand, cpos = todo[free], pos[free]
            slots, inv = torch.unique(cpos, return_inverse=True)
            first = torch.full_like(slots, keys.numel()).scatter_reduce_(0, inv, cand, "amin")
            self._keys[slots] = keys[first]  # one winner per free slot: the first to probe it
            rows[first] = slots
            placed = torch.zeros(keys.numel(), dtype=torch.bool)
            placed[first] = True
            if first.numel():
                self._longest = max(self._longest, int(dist[placed[todo]].max()))
            go = ~placed[todo]
            todo, pos, dist = todo[go], (pos[go] + 1) % self.rows, dist[go] + 1
        self.count += keys.numel()
        return rows

    def seen(self, rows: Tensor) -> Tensor:
        """Whether each row (``-1``: not held) was stored at the current ``clock`` (CPU bool).

        Example:
            >>> import torch
            >>> t = KeyedScoreTable(capacity=4)
            >>> t.update(torch.tensor([1]), torch.tensor([0.5]))
            >>> t.seen(t.lookup(torch.tensor([1, 2]))).tolist()
            [True, False]
        """
        return (rows >= 0) & (self._stamps[rows.clamp(min=0)] == self.clock)

    # ------------------------------------------------------------------ writes
    def put(self, keys: Tensor, losses: Tensor, rows: Tensor | None = None) -> None:
        """Store ``losses`` as the scores of checked ``keys`` (:func:`check_keys`), stamped with ``clock``.

        The per-step path: ``rows`` (from :meth:`lookup`) saves a second lookup. Keys the table
        does not hold are inserted (the oldest forgotten first if they would not fit); the losses
        are queued like any score table's (:meth:`~leanbatch.scores.ScoreTable.store`).
        """
        rows = self.lookup(keys) if rows is None else rows
        absent = rows < 0
        if bool(absent.any()):
            if keys.numel() > self.capacity // 2:
                raise ValueError(
                    f"a batch of {keys.numel()} keys needs a table of capacity >= {2 * keys.numel()} "
                    f"(twice the batch), got capacity={self.capacity}: build the table (or StreamInfoBatch) "
                    "with a capacity above the number of distinct keys you want scored"
                )
            new = torch.unique(keys[absent])
            if self.count + new.numel() > self.capacity:  # the batch's own keys stay
                target = min(self.capacity * 7 // 8, self.capacity - new.numel())
                self._forget(self.count - target, rows[~absent])
            self._insert(new)
            rows = self.lookup(keys)
        self._stamps[rows] = self.clock
        self.store(rows, losses, check=False)

    def update(self, indices: Tensor, losses: Tensor) -> None:
        """Store ``losses`` as the scores of the keys ``indices`` (checked; see :meth:`put`)."""
        keys = check_keys(indices, "keys")
        losses = check_per_sample_loss(losses, "losses")
        if losses.shape[0] != keys.shape[0]:
            raise ValueError(
                f"losses has {losses.shape[0]} entries but keys has {keys.shape[0]}: pass one loss per key"
            )
        self.put(keys, losses)

    def _forget(self, n: int, keep_rows: Tensor) -> None:
        """Drop the ``n`` keys stored longest ago, never those in ``keep_rows``, and rebuild."""
        keys, rows = self._live()
        stamps = self._stamps.clone()
        stamps[keep_rows] = torch.iinfo(torch.int32).max
        rows = rows[_newest(stamps[rows], keys.numel() - n)]
        at = rows.to(self.device)
        var = self.variances[at] if self.tracks_variance else None
        self._rebuild(self._keys[rows], self._stamps[rows], self.values[at], var)
        self.evicted += n

    def _rebuild(self, keys: Tensor, stamps: Tensor, scores: Tensor, var: Tensor | None = None) -> None:
        """Hold exactly ``keys``, with their stamps, scores and (``variance=True``) variances."""
        self._keys.fill_(_EMPTY)
        self._stamps.fill_(-1)
        self._longest, self.count = 0, 0
        rows = self._insert(keys)
        self._stamps[rows] = stamps.to(torch.int32)
        at, values = rows.to(self.device), self.values
        values.fill_(float("nan"))
        values[at] = scores.to(self.device, torch.float32)
        if var is not None:
            self.variances.fill_(float("nan"))
            self.variances[at] = var.to(self.device, torch.float32)

    def merge(self, parts: list[tuple[Tensor, Tensor, Tensor]]) -> None:
        """Hold the union of ``parts`` (each a table's ``keys``, ``values``, ``stamps``, as in
        :meth:`state_dict`; one per rank): per key the score stored last (the largest stamp), the
        oldest forgotten past the capacity (:meth:`put`'s rule), the same result on every rank.

        A key stored at the current ``clock`` by two parts is refused: two ranks trained it in one pass.

        Example:
            >>> import torch
            >>> t = KeyedScoreTable(capacity=4)
            >>> t.clock = 1
            >>> t.merge([(torch.tensor([1, 2]), torch.tensor([0.5, 1.0]), torch.tensor([0, 1])),
            ...          (torch.tensor([1, 3]), torch.tensor([0.7, 2.0]), torch.tensor([1, 1]))])
            >>> [x.tolist() for x in t.items()]
            [[1, 2, 3], [0.699999988079071, 1.0, 2.0]]
        """
        if self.tracks_variance:
            raise ValueError(
                "merge: a table with variance=True cannot be merged (its variances are not carried)"
            )
        keys, values, stamps = (torch.cat([p[i].cpu() for p in parts]) for i in range(3))
        owner = torch.cat([torch.full((p[0].numel(),), r) for r, p in enumerate(parts)])
        order = torch.argsort(stamps, stable=True)
        order = order[torch.argsort(keys[order], stable=True)]  # by key, then stamp
        keys, values, stamps, owner = keys[order], values[order], stamps[order], owner[order]
        now = torch.nonzero(stamps == self.clock).squeeze(1)
        twice = now[1:][keys[now[1:]] == keys[now[:-1]]]
        if twice.numel():
            at = int(twice[0])
            raise ValueError(
                f"keys: ranks {int(owner[at - 1])} and {int(owner[at])} both trained key {int(keys[at])} in pass "
                f"{self.clock}: a key names one sample, seen once a pass; each rank must read its own shard of "
                "the stream (datasets.distributed.split_dataset_by_node, or a generator of the rank's part)"
            )
        last = torch.ones(keys.shape, dtype=torch.bool)
        last[:-1] = keys[1:] != keys[:-1]
        keys, values, stamps = keys[last], values[last], stamps[last]
        if keys.numel() > self.capacity:
            keep = _newest(stamps, self.capacity)
            self.evicted += keys.numel() - self.capacity
            keys, values, stamps = keys[keep], values[keep], stamps[keep]
        self._rebuild(keys, stamps, values)

    # ------------------------------------------------------------------ reads
    def get(self, indices: Tensor) -> Tensor:
        """Scores of the keys ``indices`` (NaN where never scored or forgotten), on the table's device."""
        rows = self.lookup(check_keys(indices, "keys"))
        values = self.values
        got = values[rows.clamp(min=0).to(values.device)]
        return torch.where((rows >= 0).to(values.device), got, float("nan"))

    def items(self) -> tuple[Tensor, Tensor]:
        """The keys held (int64, CPU, sorted) and their scores (float32, CPU; NaN: never a finite loss).

        Example:
            >>> import torch
            >>> t = KeyedScoreTable(capacity=4)
            >>> t.update(torch.tensor([9, 3]), torch.tensor([1.0, 2.0]))
            >>> [x.tolist() for x in t.items()]
            [[3, 9], [2.0, 1.0]]
        """
        keys, rows = self._live()
        return keys, self.values[rows.to(self.device)].cpu()

    def _live(self) -> tuple[Tensor, Tensor]:
        """The keys held, sorted (int64, CPU), and their rows."""
        live = torch.nonzero(self._keys != _EMPTY).squeeze(1)
        keys, order = torch.sort(self._keys[live])
        return keys, live[order]

    @property
    def nbytes(self) -> int:
        """Bytes held between steps: the scores (and variances) and the CPU index (keys, stamps)."""
        return super().nbytes + self._keys.nbytes + self._stamps.nbytes

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The keys held, sorted, with their scores and stamps: tensors and plain values only."""
        keys, rows = self._live()
        dev = rows.to(self.device)
        return {
            "capacity": self.capacity,
            "ema": self.ema,
            "keys": keys,
            "values": self.values[dev].cpu(),
            "stamps": self._stamps[rows].clone(),
            "variance": self.variances[dev].cpu() if self.tracks_variance else None,
            "nonfinite": int(self.nonfinite_count),
            "clock": self.clock,
            "evicted": self.evicted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, checked first (``ValueError`` naming the wrong key).

        Example:
            >>> import torch
            >>> t = KeyedScoreTable(capacity=4)
            >>> t.update(torch.tensor([9]), torch.tensor([1.0]))
            >>> u = KeyedScoreTable(capacity=4); u.load_state_dict(t.state_dict())
            >>> u.get(torch.tensor([9])).tolist()
            [1.0]
        """
        state = dict(require(state, ("keys", "values", "stamps", "clock"), "state_dict"))
        keys, stamps = state["keys"], state["stamps"]
        if not (isinstance(keys, Tensor) and keys.dim() == 1 and keys.dtype == torch.int64) or bool(
            (keys.diff() <= 0).any() | (keys[:1] < 0).any()  # sorted: the first is the least
        ):
            raise ValueError("state_dict['keys'] must be a sorted 1-D int64 tensor of distinct keys >= 0")
        n = keys.shape[0]
        if n > self.capacity:
            raise ValueError(
                f"state_dict holds {n} keys but this table's capacity is {self.capacity}: build it with "
                f"capacity >= {n} (the saved table's was {state.get('capacity')})"
            )
        values = check_saved_tensor(state, "values", (n,))
        if not isinstance(stamps, Tensor) or tuple(stamps.shape) != (n,) or stamps.is_floating_point():
            raise ValueError(f"state_dict['stamps'] must be a tensor of {n} ints")
        var = self._saved_variance(state, n)
        nonfinite = check_int(state.get("nonfinite", 0), "state_dict['nonfinite']", 0)
        clock = check_int(state["clock"], "state_dict['clock']")
        evicted = check_int(state.get("evicted", 0), "state_dict['evicted']", 0)
        self._rebuild(keys, stamps, values, var)
        self.nonfinite_count.fill_(nonfinite)
        self.clock, self.evicted = clock, evicted


def _newest(stamps: Tensor, k: int) -> Tensor:
    """Positions of the ``k`` newest of key-sorted entries (largest stamp, then key), ascending."""
    return torch.sort(torch.argsort(stamps, stable=True)[stamps.numel() - k :]).values
