"""The one verdict rule: paired per-seed differences, their 95% interval, better / on / worse.

Every comparison of the study (an arm against the envelope of the baseline's budgets, an arm
against its uniform twin) pairs runs by seed: same initial weights, run side by side through the
same spells of machine load. For each seed ``s`` the difference ``d_s = metric - reference``
(in the metric's units) is taken, then:

1. the mean and sample standard deviation of ``d_s`` over seeds, and the 95% confidence interval
   of the mean (Student's t with n - 1 degrees of freedom);
2. with the metric's *goal* (``max``: higher is better, e.g. accuracy; ``min``: lower is better,
   e.g. eval loss or perplexity), the *gain* is ``d_s`` (max) or ``-d_s`` (min);
3. ``better`` when the interval of the gain lies above zero *and* the mean gain is larger than
   the differences' standard deviation (larger than the seed-to-seed spread); ``worse`` in the
   mirror case; otherwise ``on`` (a tie, within noise); ``undecided`` with one seed (no spread).

The functions take plain numbers, so the rule can be checked on known values:

    >>> interval([0.5, 0.7, 0.6]).verdict, interval([0.5, 0.7, 0.6], goal="min").verdict
    ('better', 'worse')
    >>> round(interpolate([(10.0, 90.0), (20.0, 94.0)], 15.0), 6)
    92.0
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

__all__ = [
    "CONFIDENCE",
    "GOALS",
    "Comparison",
    "Interval",
    "SeedComparison",
    "default_goal",
    "interpolate",
    "interval",
    "judge",
    "mean_of",
    "spread_of",
    "std_of",
    "t_quantile",
]

CONFIDENCE = 0.95
GOALS = ("max", "min")


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (a two-sided 95% interval), by scipy.

    Example:
        >>> round(t_quantile(2), 3), round(t_quantile(1000), 3)
        (4.303, 1.962)
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    from scipy.stats import t

    return float(t.ppf(0.5 + CONFIDENCE / 2, df))


def default_goal(metric: str) -> str:
    """The goal of a metric when none is given: ``min`` for a loss, a perplexity or an error, else ``max``.

    Example:
        >>> default_goal("accuracy"), default_goal("eval_loss"), default_goal("perplexity")
        ('max', 'min', 'min')
    """
    name = metric.lower()
    return "min" if any(w in name for w in ("loss", "perplexity", "ppl", "error", "mse", "mae")) else "max"


def interpolate(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The value of the piecewise-linear curve through ``(cost, metric)`` points at cost ``t`` (work or time).

    Points are taken in order of cost (runs at equal costs are averaged); ``None`` when ``t`` is
    outside the measured costs or there are fewer than two distinct costs: never extrapolated.

    Example:
        >>> interpolate([(20.0, 94.0), (10.0, 90.0)], 12.5), interpolate([(10.0, 90.0), (20.0, 94.0)], 21.0)
        (91.0, None)
    """
    merged: dict[float, list[float]] = {}
    for cost, value in points:
        merged.setdefault(float(cost), []).append(float(value))
    xs = sorted(merged)
    if len(xs) < 2 or not xs[0] <= t <= xs[-1]:
        return None
    ys = [statistics.fmean(merged[x]) for x in xs]
    k = max(1, bisect.bisect_left(xs, t))  # the first segment that reaches t
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return y0 + (y1 - y0) * (t - x0) / (x1 - x0)


@dataclass
class Interval:
    """The mean of paired differences, their spread, the 95% t interval of the mean and the verdict.

    Example:
        >>> Interval(0.5, None, None, None, "undecided").verdict
        'undecided'
    """

    diff_mean: float
    diff_std: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str


def interval(diffs: Sequence[float], goal: str = "max") -> Interval:
    """The verdict rule (module docstring) on paired per-seed differences ``metric - reference``:
    ``undecided`` with one difference, ``no pairs`` with none.

    Example:
        >>> r, one, none = interval([-0.5, -0.7, -0.6], goal="min"), interval([0.5]), interval([])
        >>> round(r.diff_mean, 2), round(r.diff_std, 2), r.verdict, one.verdict, none.verdict
        (-0.6, 0.1, 'better', 'undecided', 'no pairs')
    """
    if not diffs:
        return Interval(float("nan"), None, None, None, "no pairs")
    mean = mean_of(diffs)
    if len(diffs) < 2:
        return Interval(mean, None, None, None, "undecided")
    std = statistics.stdev(diffs)
    half = t_quantile(len(diffs) - 1) * std / math.sqrt(len(diffs))
    up = -mean if goal == "min" else mean  # the mean gain (for a min metric, a decrease)
    verdict = "better" if up - half > 0 and up > std else "worse" if up + half < 0 and -up > std else "on"
    return Interval(mean, std, mean - half, mean + half, verdict)


@dataclass
class SeedComparison:
    """One seed of an arm against a reference curve (the envelope) at the arm's own cost (on the study's clock).

    ``range`` is ``inside``, ``faster`` (quicker than every reference run of the seed), ``slower``
    (slower than every one), ``gap`` (between two families, neither defined there) or ``none``
    (no reference at that seed); outside, ``reference`` and ``diff`` are None.
    """

    seed: int
    cost: float | None
    metric: float
    reference: float | None
    diff: float | None
    range: str
    family: str | None = None  # the envelope's family that is best at the arm's time


@dataclass
class Comparison:
    """An arm at equal cost: its paired differences to the reference and the verdict: ``better``,
    ``on``, ``worse``, ``out of range`` (some seed outside the reference's times), ``undecided`` (one
    seed) or ``no envelope`` (fewer than two reference runs at some seed). The aggregate fields are
    None unless every seed is inside.
    """

    seeds: list[int]
    metric_mean: float
    cost_mean: float | None
    reference_mean: float | None = None
    diff_mean: float | None = None
    diff_std: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str = "no envelope"
    faster: int = 0
    slower: int = 0
    per_seed: list[SeedComparison] = field(default_factory=list)


def judge(per_seed: Sequence[SeedComparison], goal: str = "max") -> Comparison:
    """An arm's :class:`Comparison` from its seeds paired with the reference, by the one rule.

    Example:
        >>> pairs = [SeedComparison(0, 10.0, 91.0, 90.0, 1.0, "inside"), SeedComparison(1, 10.0, 92.0, 90.8, 1.2, "inside")]
        >>> c = judge(pairs)
        >>> round(c.diff_mean, 2), c.verdict, judge(pairs[:1] + [SeedComparison(1, 30.0, 92.0, None, None, "slower")]).verdict
        (1.1, 'on', 'out of range')
    """
    per_seed = list(per_seed)
    result = Comparison(
        seeds=[p.seed for p in per_seed],
        metric_mean=mean_of([p.metric for p in per_seed]),
        cost_mean=None if any(p.cost is None for p in per_seed) else mean_of([p.cost for p in per_seed]),  # type: ignore[misc]
        faster=sum(p.range == "faster" for p in per_seed),
        slower=sum(p.range == "slower" for p in per_seed),
        per_seed=per_seed,
    )
    if not per_seed or any(p.range == "none" for p in per_seed):
        return result
    if any(p.range != "inside" for p in per_seed):
        result.verdict = "out of range"
        return result
    stats = interval([p.diff for p in per_seed if p.diff is not None], goal)
    reference = mean_of([p.reference for p in per_seed if p.reference is not None])
    return replace(result, reference_mean=reference, **asdict(stats))


def mean_of(xs: Sequence[float]) -> float:
    """The mean over seeds (NaN for none).

    Example:
        >>> mean_of([1.0, 2.0]), mean_of([])
        (1.5, nan)
    """
    return float(statistics.fmean(xs)) if xs else float("nan")


def std_of(xs: Sequence[float]) -> float:
    """The sample standard deviation over seeds (0 for a single value).

    Example:
        >>> std_of([1.0, 3.0]), std_of([2.0])
        (1.4142135623730951, 0.0)
    """
    return float(statistics.stdev(xs)) if len(xs) > 1 else 0.0


def spread_of(xs: Sequence[float | None]) -> tuple[float | None, float | None]:
    """The mean and the standard deviation of ``xs`` over seeds; ``(None, None)`` when any is missing.

    Example:
        >>> spread_of([1.0, 3.0])[0], spread_of([1.0, None])
        (2.0, (None, None))
    """
    if not xs or any(x is None for x in xs):
        return None, None
    return mean_of(xs), std_of(xs)  # type: ignore[arg-type]
