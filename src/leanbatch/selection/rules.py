"""Selection rules: which rows of a batch to keep, given one score (loss) per row.

Pure functions on the losses' device, and the small rule objects a selector holds: Composer's
rank rule (weight ``((i + 0.5) / N) ** (1 / keep - 1)`` for ascending rank ``i``), online batch
selection's loss-rank exponential (weight ``s ** (-r / N)`` for hardness rank ``r``, pressure
``s``), top-k, and uniform, the twin every rule is compared with. Each keeps
``k = max(1, int(keep * N))`` rows, drawn without replacement by a Gumbel top-k (Gumbel noise on
the log-weights, the ``k`` largest: the sequential weighted draw), ``k`` known on the host: no
host-device sync, no numpy, no global RNG. Without ``generator=`` the functions draw from one
module-level :class:`~leanbatch.rng.Generators` stream per device (:func:`seed_selection`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from leanbatch.checks import check_fraction, check_per_sample_loss, check_seed
from leanbatch.ranking import check_pressure, decayed_pressure, gumbel_top_k, loss_rank_draw
from leanbatch.rng import Generators, canonical_device
from leanbatch.selection.scoring import rankable_losses

_DEFAULT = Generators()  # the draws of every call without generator=: one stream per device


def seed_selection(seed: int, *, rank: int | None = None) -> None:
    """Reseed the generators used without ``generator=``: rank ``r`` draws from ``mix_seed(seed, r)``;
    ``rank`` replaces the process group's (e.g. the data-parallel rank under tensor parallelism).

    Example:
        >>> import torch
        >>> losses = torch.rand(16)
        >>> seed_selection(7); a = select_indices(losses, 0.5)
        >>> seed_selection(7); b = select_indices(losses, 0.5)
        >>> seed_selection(7, rank=1); c = select_indices(losses, 0.5)
        >>> torch.equal(a, b), torch.equal(a, c)
        (True, False)
        >>> from leanbatch.rng import DEFAULT_SEED
        >>> seed_selection(DEFAULT_SEED)  # back to the default, the process group's rank
    """
    _DEFAULT.reset(check_seed(seed), rank)


def resolve_generator(generator: Any, device: torch.device | str) -> torch.Generator:
    """``generator`` (checked to live on ``device``), or the module's stream for ``device``."""
    if generator is None:
        return _DEFAULT.stream(device)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    gdev, ddev = canonical_device(generator.device), canonical_device(device)
    if gdev != ddev:
        raise ValueError(
            f"generator is on {gdev} but the losses are on {ddev}: sampling runs where the losses are, "
            f"so pass torch.Generator(device='{ddev}')"
        )
    return generator


def num_selected(n: int, keep: float) -> int:
    """How many of ``n`` examples a fixed-count rule keeps: ``max(1, int(keep * n))`` (Composer:
    ``int(keep * n)``, which keeps nothing from a small batch).
    """
    return _count(_rows(n), check_fraction(keep, "keep"))


def _count(n: int, keep: float) -> int:
    """:func:`num_selected` of a checked ``n`` and ``keep`` (a rule's, checked at construction)."""
    return max(1, int(keep * n))


def _rows(n: Any) -> int:
    """``n`` if it is a batch size (an int >= 1)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the batch must hold at least one example, got n={n!r}")
    return n


def _losses(losses: Any) -> Tensor:
    """Per-example losses to rank: a 1-D real tensor, integer losses as floats."""
    return check_per_sample_loss(
        rankable_losses(losses, "losses") if isinstance(losses, Tensor) else losses, "losses"
    )


def _drawn(rule: Rule, losses: Any, generator: Any) -> Tensor:
    """``rule``'s draw from checked ``losses`` with ``generator`` (checked) or the device's stream."""
    losses = _losses(losses)
    return rule.drawn(
        losses, Draw(losses.shape[0], losses.device), resolve_generator(generator, losses.device)
    )


def select_indices(losses: Tensor, keep: float, generator: torch.Generator | None = None) -> Tensor:
    """Positions (int64, ascending, on the losses' device) of the rows Composer's rank rule keeps.

    Only the order of the losses matters (ties keep batch order; NaN counts as the largest).

    Example:
        >>> import torch
        >>> losses = torch.tensor([0.1, 5.0, 0.2, 4.0, 0.3, 3.0])
        >>> select_indices(losses, keep=0.5, generator=torch.Generator().manual_seed(0)).shape
        torch.Size([3])
        >>> select_indices(losses, keep=1.0).tolist()  # keep=1 keeps everything
        [0, 1, 2, 3, 4, 5]
    """
    return _drawn(RankRule(keep), losses, generator)


def select_by_loss_rank(
    losses: Tensor, keep: float, pressure: float, generator: torch.Generator | None = None
) -> Tensor:
    """Positions of the rows online batch selection keeps, ascending, on the losses' device.

    ``losses``: the last known loss of each row, NaN (never scored) counting as the largest;
    ``pressure``: the selection pressure ``s >= 1``, finite.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> select_by_loss_rank(torch.tensor([0.1, 9.0, 0.2, 8.0]), keep=0.5, pressure=1e6, generator=g).tolist()
        [1, 3]
    """
    return _drawn(LossRankRule(keep, pressure), losses, generator)


class Draw(NamedTuple):
    """What a rule may use besides the scores: batch size, device, the draw's generator (``None``
    for a rule that does not draw), progress, and whether a varying count must keep one row.
    """

    n: int
    device: torch.device
    generator: torch.Generator | None = None
    progress: float = 0.0
    at_least_one: bool = True


class Rule:
    """A selector's rule: ``positions(scores, draw)``; ``keep`` (``None``: the count varies),
    ``random`` (it needs the draw's generator), ``needs_scores`` (else no source is read).

    Its arguments are checked when it is built; the scores and the draw's generator once per
    batch shape, dtype and device, not at every draw. A new rule implements
    :meth:`drawn` (or overrides :meth:`positions`).

    Example:
        >>> Rule.needs_scores, RankRule(0.3).keep, UniformRule(0.3).needs_scores
        (True, 0.3, False)
    """

    name = ""
    keep: float | None = None
    random = True
    needs_scores = True
    _checked: tuple[Any, ...] = ()  # the (n, shape, dtype, device) of the scores last checked

    def positions(self, scores: Tensor | None, draw: Draw) -> Tensor:
        """Positions (int64, ascending) of the rows to keep, on the scores' device (or ``draw.device``)."""
        return self.drawn(scores, draw, self._ready(scores, draw))

    def _ready(self, scores: Tensor | None, draw: Draw) -> torch.Generator | None:
        """Check ``scores`` (one real score per row) and ``draw`` once per batch shape, dtype and
        device; the generator to draw from (by default the device's stream, :func:`seed_selection`)."""
        key = (draw.n, draw.device, None if scores is None else (scores.shape, scores.dtype, scores.device))
        if key != self._checked:
            device = draw.device if scores is None else _losses(scores).device
            if _rows(draw.n) and scores is not None and scores.shape[0] != draw.n:
                raise ValueError(f"scores must hold one score per row ({draw.n}), got {scores.shape[0]}")
            if draw.generator is not None:
                resolve_generator(draw.generator, device)
            self._checked = key
        if draw.generator is not None or not self.random:
            return draw.generator
        return _DEFAULT.stream(draw.device if scores is None else scores.device)

    def drawn(self, scores: Tensor | None, draw: Draw, generator: torch.Generator | None) -> Tensor:
        """:meth:`positions` of checked scores, with the generator to draw from."""
        raise NotImplementedError

    def num_kept(self, n: int) -> int | None:
        """How many of ``n`` rows the rule keeps (:func:`num_selected`; ``None``: the count varies).

        Example:
            >>> RankRule(0.3).num_kept(10), RankRule(0.3).num_kept(2), Rule().num_kept(10)
            (3, 1, None)
        """
        return None if self.keep is None else _count(n, self.keep)

    def mask(self, scores: Tensor | None, draw: Draw) -> Tensor:
        """The same choice as a bool mask over the ``draw.n`` rows (global selection splits it
        among the ranks); the same draws as :meth:`positions`, no host read of its own.

        Example:
            >>> import torch
            >>> TopRule(0.5).mask(torch.tensor([3.0, 1.0, 2.0, 0.0]), Draw(4, torch.device("cpu"))).tolist()
            [True, False, True, False]
        """
        pos = self.positions(scores, draw)
        return torch.zeros(draw.n, dtype=torch.bool, device=pos.device).index_fill_(0, pos, True)

    def state_dict(self) -> dict[str, Any]:
        """What to checkpoint, by name (nothing for a stateless rule)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""


class RankRule(Rule):
    """Composer's rank rule keeping ``keep`` of each batch (:func:`select_indices`).

    Example:
        >>> import torch
        >>> RankRule(0.5).positions(torch.rand(8), Draw(8, torch.device("cpu"), torch.Generator())).shape
        torch.Size([4])
    """

    name = "rank"

    def __init__(self, keep: float = 0.5):
        self.keep: float = check_fraction(keep, "keep")

    def drawn(self, scores: Tensor | None, draw: Draw, generator: torch.Generator | None) -> Tensor:
        k = _count(draw.n, self.keep)
        if k >= draw.n:
            return torch.arange(draw.n, device=draw.device if scores is None else scores.device)
        return self._pick(scores, draw, k, generator)

    def _pick(self, scores: Tensor | None, draw: Draw, k: int, generator: torch.Generator | None) -> Tensor:
        """:meth:`drawn` when ``k < draw.n`` rows are kept."""
        assert scores is not None and generator is not None  # a scoring rule always has a source
        order = torch.argsort(scores.detach(), stable=True)  # rank position -> batch position
        pos = (torch.arange(draw.n, device=scores.device, dtype=torch.float32) + 0.5) / draw.n
        return gumbel_top_k(order, torch.log(pos) * (1.0 / self.keep - 1.0), k, generator)


class TopRule(RankRule):
    """The hardest ``keep`` share of each batch, deterministic.

    Example:
        >>> import torch
        >>> TopRule(0.5).positions(torch.tensor([3.0, 1.0, 2.0, 0.0]), Draw(4, torch.device("cpu"))).tolist()
        [0, 2]
    """

    name = "top"
    random = False

    def _pick(self, scores: Tensor | None, draw: Draw, k: int, generator: torch.Generator | None) -> Tensor:
        assert scores is not None
        hard = torch.nan_to_num(scores.detach().float(), nan=float("inf"))
        return torch.sort(torch.topk(hard, k, sorted=False).indices).values


class UniformRule(RankRule):
    """A uniform random ``keep`` share of each batch, without scores.

    Example:
        >>> import torch
        >>> UniformRule(0.25).positions(None, Draw(8, torch.device("cpu"), torch.Generator())).shape
        torch.Size([2])
    """

    name = "uniform"
    needs_scores = False

    def _pick(self, scores: Tensor | None, draw: Draw, k: int, generator: torch.Generator | None) -> Tensor:
        assert generator is not None
        u = torch.rand(draw.n, generator=generator, device=draw.device)
        return torch.sort(torch.topk(u, k, sorted=False).indices).values


class LossRankRule(RankRule):
    """Online batch selection's loss-rank exponential, ``pressure`` decaying to ``final_pressure``.

    Example:
        >>> import torch
        >>> rule, draw = LossRankRule(0.5, pressure=1e6), Draw(4, torch.device("cpu"), torch.Generator())
        >>> rule.positions(torch.tensor([0.1, 9.0, 0.2, 8.0]), draw).tolist()
        [1, 3]
    """

    name = "loss_rank"

    def __init__(self, keep: float = 0.5, pressure: float = 100.0, final_pressure: float | None = None):
        super().__init__(keep)
        self.pressure = check_pressure(pressure)
        self.final_pressure = (
            None if final_pressure is None else check_pressure(final_pressure, "final_pressure")
        )

    def _pick(self, scores: Tensor | None, draw: Draw, k: int, generator: torch.Generator | None) -> Tensor:
        assert scores is not None and generator is not None
        pressure = decayed_pressure(draw.progress, self.pressure, self.final_pressure)
        return loss_rank_draw(scores, k, pressure, generator)
