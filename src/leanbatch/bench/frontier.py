"""The honest yardstick: each method against the baseline trained shorter, at equal time.

A method that saves 30% of the time is only worth using if it beats the simplest thing a user
can do with that 30%: train the baseline for 30% fewer steps, with its learning-rate schedule
ending at its own end. The benchmark trains the baseline at several *budgets* (fractions of its
steps, e.g. 0.5, 0.7, 0.85 and 1); at each seed those runs draw the baseline's accuracy-vs-time
*frontier*. Every other row is compared with it:

1. For each seed ``s``, the frontier is the piecewise-linear curve through the points
   ``(training time, final accuracy)`` of that seed's budget runs, in order of time.
2. The method's run at seed ``s`` took ``t_s`` seconds and reached ``a_s``; the frontier's
   accuracy at ``t_s`` is ``f_s``, and the paired difference is ``d_s = a_s - f_s``. Pairing by
   seed compares runs that started from the same initial weights and ran interleaved, epoch by
   epoch, through the same spells of machine load.
3. Never extrapolated: a run faster than the seed's shortest budget or slower than its longest
   has no ``f_s``, and the row's verdict is ``out of range``.
4. The row reports the mean and sample standard deviation of ``d_s`` over seeds and the 95%
   confidence interval of the mean (Student's t with n - 1 degrees of freedom).
5. Verdict: ``above`` when the interval lies above zero *and* the mean difference is larger
   than the differences' standard deviation (larger than the seed-to-seed spread); ``below`` in
   the mirror case; otherwise ``on`` (a tie, within noise). With one seed there is no spread
   and the verdict is ``undecided``. For up to six seeds the interval is the stricter of the
   two conditions; the spread condition keeps a difference that single seeds would not
   reliably show a tie when many seeds make the interval narrow.

The functions take plain numbers, so the rule can be checked on known curves:

    >>> frontier = {0: [(10.0, 90.0), (20.0, 94.0)], 1: [(10.0, 91.0), (20.0, 95.0)]}
    >>> row = compare(frontier, {0: (15.0, 93.0), 1: (15.0, 94.0)})
    >>> row.frontier_acc_mean, row.diff_mean, row.verdict
    (92.5, 1.0, 'above')
    >>> compare(frontier, {0: (25.0, 99.0), 1: (15.0, 94.0)}).verdict
    'out of range'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leanbatch.bench.records import RunResult

__all__ = [
    "CONFIDENCE",
    "RULE",
    "SeedComparison",
    "Comparison",
    "interpolate",
    "t_quantile",
    "compare",
    "judge",
    "Interval",
    "interval",
    "is_frontier",
    "frontier_point",
    "clock_time",
    "equal_time",
    "CLOCKS",
    "mean_of",
    "std_of",
]

CONFIDENCE = 0.95
RULE = (
    "diff = method accuracy - the same seed's baseline frontier (budget runs, piecewise linear in "
    "training time) at the method's own time, never extrapolated; above/below when the 95% t interval "
    "of the mean diff excludes 0 and |mean diff| > std of the diffs; otherwise on (within noise)"
)

# Student's t, 97.5% quantile (two-sided 95%), for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (a two-sided 95% interval).

    Tabulated up to 30 degrees of freedom, then the Cornish-Fisher expansion around the normal
    quantile (error below 1e-4).

    Example:
        >>> t_quantile(2), round(t_quantile(1000), 3)
        (4.303, 1.962)
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def interpolate(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The accuracy of the piecewise-linear curve through ``(time, accuracy)`` points at time ``t``.

    Points are taken in order of time (runs at equal times are averaged); ``None`` when ``t`` is
    outside the measured times or there are fewer than two distinct times: never extrapolated.

    Example:
        >>> interpolate([(20.0, 94.0), (10.0, 90.0)], 12.5)
        91.0
        >>> interpolate([(10.0, 90.0), (20.0, 94.0)], 21.0) is None
        True
    """
    merged: dict[float, list[float]] = {}
    for time, acc in points:
        merged.setdefault(float(time), []).append(float(acc))
    xs = sorted(merged)
    if len(xs) < 2 or not xs[0] <= t <= xs[-1]:
        return None
    ys = [statistics.fmean(merged[x]) for x in xs]
    k = 1
    while xs[k] < t:  # the first segment that reaches t (t <= xs[-1], so k stays in range)
        k += 1
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return y0 + (y1 - y0) * (t - x0) / (x1 - x0)


@dataclass
class SeedComparison:
    """One seed of a row: the method's run against the same seed's frontier.

    ``range`` is ``inside``, ``faster`` (quicker than the seed's shortest budget run) or
    ``slower`` (slower than its longest), ``none`` (no frontier at that seed) or, against an
    envelope of several families, ``gap`` (between families, none defined there); outside,
    ``frontier_acc`` and ``diff`` are None.
    """

    seed: int
    train_time_s: float
    acc: float
    frontier_acc: float | None
    diff: float | None
    range: str


@dataclass
class Comparison:
    """A method row at equal time: paired differences to the frontier and the verdict.

    ``verdict`` is ``above``, ``on``, ``below``, ``out of range`` (some seed outside the
    frontier's times), ``undecided`` (one seed: no spread) or ``no frontier`` (fewer than two
    budget runs at some seed). The aggregate fields are None unless every seed is inside.
    """

    seeds: list[int]
    acc_mean: float
    train_time_s_mean: float
    frontier_acc_mean: float | None
    diff_mean: float | None
    diff_std: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str
    faster: int = 0  # seeds quicker than the shortest budget run
    slower: int = 0  # seeds slower than the longest budget run
    per_seed: list[SeedComparison] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain values for results.json."""
        return asdict(self)


def _range(points: Sequence[tuple[float, float]], t: float) -> str:
    times = [p[0] for p in points]
    if t < min(times):
        return "faster"
    if t > max(times):
        return "slower"
    return "inside"


def compare(
    frontier: Mapping[int, Sequence[tuple[float, float]]],
    runs: Mapping[int, tuple[float, float]],
) -> Comparison:
    """Compare a method's runs ``{seed: (time, acc)}`` with the frontier ``{seed: [(time, acc), ...]}``.

    Only seeds present in both are paired. See the module docstring for the rule.

    Example:
        >>> f = {0: [(10.0, 90.0), (20.0, 94.0)], 1: [(10.0, 90.5), (20.0, 94.5)]}
        >>> c = compare(f, {0: (20.0, 94.2), 1: (10.0, 90.3)})
        >>> [round(s.diff, 2) for s in c.per_seed], c.verdict
        ([0.2, -0.2], 'on')
    """
    per_seed: list[SeedComparison] = []
    for s in sorted(s for s in runs if s in frontier):
        t, acc = runs[s]
        points = frontier[s]
        if len({p[0] for p in points}) < 2:
            per_seed.append(SeedComparison(s, t, acc, None, None, "none"))
            continue
        f = interpolate(points, t)
        per_seed.append(SeedComparison(s, t, acc, f, None if f is None else acc - f, _range(points, t)))
    return judge(per_seed)


def judge(per_seed: Sequence[SeedComparison]) -> Comparison:
    """A row's :class:`Comparison` from its seeds paired with a yardstick (the step frontier, or the
    envelope of :mod:`~leanbatch.bench.envelope`) by the one rule of the module docstring: ``no
    frontier`` when some seed has none, ``out of range`` when some seed is not ``inside`` it.

    Example:
        >>> pairs = [SeedComparison(0, 10.0, 91.0, 90.0, 1.0, "inside"), SeedComparison(1, 10.0, 92.0, 90.8, 1.2, "inside")]
        >>> c = judge(pairs)
        >>> round(c.diff_mean, 2), c.verdict
        (1.1, 'on')
    """
    per_seed = list(per_seed)
    result = Comparison(
        seeds=[p.seed for p in per_seed],
        acc_mean=mean_of([p.acc for p in per_seed]),
        train_time_s_mean=mean_of([p.train_time_s for p in per_seed]),
        frontier_acc_mean=None,
        diff_mean=None,
        diff_std=None,
        ci_low=None,
        ci_high=None,
        verdict="no frontier",
        faster=sum(p.range == "faster" for p in per_seed),
        slower=sum(p.range == "slower" for p in per_seed),
        per_seed=per_seed,
    )
    if not per_seed or any(p.range == "none" for p in per_seed):
        return result
    if any(p.range != "inside" for p in per_seed):
        result.verdict = "out of range"
        return result
    diffs = [p.diff for p in per_seed if p.diff is not None]
    result.frontier_acc_mean = mean_of([p.frontier_acc for p in per_seed if p.frontier_acc is not None])
    stats = interval(diffs)
    result.diff_mean, result.diff_std, result.verdict = stats.mean, stats.std, stats.verdict
    result.ci_low, result.ci_high = stats.low, stats.high
    return result


@dataclass
class Interval:
    """The mean of paired differences, their spread, the 95% t interval of the mean and the verdict.

    Example:
        >>> Interval(0.5, None, None, None, "undecided").verdict
        'undecided'
    """

    mean: float
    std: float | None
    low: float | None
    high: float | None
    verdict: str


def interval(diffs: Sequence[float]) -> Interval:
    """The one verdict rule on paired per-seed differences (module docstring, point 5): ``above`` /
    ``below`` when the 95% t interval excludes 0 and ``|mean| > std``, else ``on``; ``undecided``
    with one difference (no spread), ``no pairs`` with none.

    Example:
        >>> r = interval([0.5, 0.7, 0.6])
        >>> round(r.mean, 2), round(r.std, 2), r.verdict
        (0.6, 0.1, 'above')
        >>> interval([0.5]).verdict, interval([]).verdict
        ('undecided', 'no pairs')
    """
    if not diffs:
        return Interval(float("nan"), None, None, None, "no pairs")
    mean = mean_of(diffs)
    if len(diffs) < 2:
        return Interval(mean, None, None, None, "undecided")
    std = statistics.stdev(diffs)
    half = t_quantile(len(diffs) - 1) * std / math.sqrt(len(diffs))
    return Interval(mean, std, mean - half, mean + half, _verdict(mean, std, mean - half, mean + half))


def _verdict(mean: float, std: float, low: float, high: float) -> str:
    if low > 0 and mean > std:
        return "above"
    if high < 0 and -mean > std:
        return "below"
    return "on"


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


def is_frontier(kind: str, batch: float = 1.0) -> bool:
    """Runs of this kind draw the step frontier (the baseline at its batch size); all others are compared.

    Example:
        >>> is_frontier("baseline"), is_frontier("baseline", batch=0.5), is_frontier("sb")
        (True, False, False)
    """
    return kind == "baseline" and batch == 1.0


def frontier_point(
    label: str, runs: Sequence[RunResult], time_of: Callable[[RunResult], float]
) -> dict[str, Any]:
    """One point of a baseline family: the runs of ``label`` (one per seed), their mean and spread of
    final accuracy and of time (``time_of``: the clock).

    Example:
        >>> from leanbatch.bench.records import EpochRecord, RunResult
        >>> runs = [RunResult("baseline", "baseline", s, 10, [EpochRecord(0, 2.0 + s, 1.0, 90.0 + s, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)]) for s in (0, 1)]
        >>> p = frontier_point("baseline", runs, clock_time("wall"))
        >>> p["acc_mean"], p["train_time_s_mean"], p["seeds"]
        (90.5, 2.5, [0, 1])
    """
    return {
        "method": label,
        "budget": runs[0].budget,
        "seeds": [r.seed for r in runs],
        "acc_mean": mean_of([r.final_acc for r in runs]),
        "acc_std": std_of([r.final_acc for r in runs]),
        "train_time_s_mean": mean_of([time_of(r) for r in runs]),
        "train_time_s_std": std_of([time_of(r) for r in runs]),
    }


def clock_time(clock: str) -> Callable[[RunResult], float]:
    """The time of a run on ``clock``: ``wall`` (training wall-clock) or ``cpu`` (the process's CPU time).

    Example:
        >>> from leanbatch.bench.records import EpochRecord, RunResult
        >>> run = RunResult("sb", "sb", 0, 10, [EpochRecord(0, 2.0, 1.5, 90.0, 0.3, 0.3, 1, 10, 10, 0, 10, 0.0)])
        >>> clock_time("wall")(run), clock_time("cpu")(run)
        (2.0, 1.5)
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    return (lambda r: r.train_time) if clock == "wall" else (lambda r: r.train_cpu_time)


CLOCKS = ("wall", "cpu")


def equal_time(
    runs: Sequence[RunResult], order: Sequence[str] | None = None, clock: str = "wall"
) -> dict[str, Any]:
    """The ``equal_time`` section of results.json from finished runs.

    ``frontier``: one entry per budget (ascending) with its mean and spread of accuracy and time;
    ``rows``: one :class:`Comparison` per other method label (the baseline on smaller batches too) (``order`` first, then first-seen),
    so any method, including ones added later, is held to the same yardstick. ``clock`` is the
    time axis: ``wall`` (training wall-clock) or ``cpu`` (the process's CPU time over the same
    spans; with one thread it leaves out the time other work on a shared machine took).
    """
    time_of = clock_time(clock)
    labels = list(dict.fromkeys([*(order or []), *(r.label for r in runs)]))
    groups = {lab: [r for r in runs if r.label == lab] for lab in labels}
    groups = {lab: rs for lab, rs in groups.items() if rs}
    frontier: dict[int, list[tuple[float, float]]] = {}
    points: list[dict[str, Any]] = []
    for lab, rs in groups.items():
        if not is_frontier(rs[0].kind, rs[0].batch):
            continue
        for r in rs:
            frontier.setdefault(r.seed, []).append((time_of(r), r.final_acc))
        points.append(frontier_point(lab, rs, time_of))
    points.sort(key=lambda p: p["budget"])
    rows = []
    for lab, rs in groups.items():
        if is_frontier(rs[0].kind, rs[0].batch):
            continue
        comparison = compare(frontier, {r.seed: (time_of(r), r.final_acc) for r in rs})
        rows.append({"method": lab, "kind": rs[0].kind, **comparison.as_dict()})
    return {
        "clock": clock,
        "rule": RULE,
        "confidence": CONFIDENCE,
        "budgets": [p["budget"] for p in points],
        "frontier": points,
        "rows": rows,
    }
