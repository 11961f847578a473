"""PNG plots of a study, drawn from the results.json payload (matplotlib, no display needed):
``metric_vs_time.png`` (the metric against the cost so far on the study's clock), ``kept_per_epoch.png``
(the data loaded and backpropagated), ``loss_histograms.png`` (the scores a pruning arm planned from)
and ``equal_time.png`` (every arm against the envelope), each as report.html's caption of it
describes (:mod:`~leanbatch.engine.judging.html`). Axes name the metric and its goal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leanbatch.engine.judging.envelope import envelope_at
from leanbatch.engine.judging.files import atomic_open
from leanbatch.engine.judging.records import AXES, RunRecord, work_scale
from leanbatch.engine.judging.verdicts import std_of

__all__ = ["PLOT_NAMES", "write_plots"]

PLOT_NAMES = ("metric_vs_time.png", "kept_per_epoch.png", "loss_histograms.png", "equal_time.png")


def _mean_curve(runs: list[dict[str, Any]], key: str) -> list[float]:
    """The mean over seeds of an epoch key, epoch by epoch (a missing value: NaN, a gap in the line)."""
    return _mean_of([[e[key] for e in r["epochs"]] for r in runs])


def _mean_of(curves: list[list[float | None]]) -> list[float]:
    """The mean of ``curves`` (one per seed), point by point, up to the shortest (None: NaN, a gap)."""
    n = min(len(c) for c in curves)
    return [sum(float("nan") if c[i] is None else c[i] for c in curves) / len(curves) for i in range(n)]  # type: ignore[misc]


def _is_budget(runs: list[dict[str, Any]]) -> bool:
    first = runs[0]
    return first["kind"] == "baseline" and (first["budget"] != 1.0 or first["batch"] != 1.0)


def write_plots(payload: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the plots of ``payload`` into ``out_dir``; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in payload["runs"]:
        groups.setdefault(r["method"], []).append(r)
    groups = {k: v for k, v in groups.items() if all(r["epochs"] for r in v)}
    cfg = payload["config"]
    label = f"{cfg.get('metric', 'metric')} ({'higher' if cfg.get('goal', 'max') == 'max' else 'lower'} is better)"
    title = str(payload["data"].get("name", cfg.get("task", "")))
    written = []
    if groups:
        written.append(_metric_plot(plt, payload, groups, label, title, out_dir / "metric_vs_time.png"))
        if any(r["num_samples"] for runs in groups.values() for r in runs):
            written.append(_kept_plot(plt, groups, title, out_dir / "kept_per_epoch.png"))
    # the scores of a method's own arm (not a twin: the yardstick it is judged against), else any run's
    twins = {m.get("control") for m in cfg.get("methods", [])} - {None}
    have = [r for r in payload["runs"] if r["histograms"]]
    own = [r for r in have if r["method"] not in twins and "~" not in r["method"]]
    if have:
        written.append(_histogram_plot(plt, (own or have)[0], out_dir / "loss_histograms.png"))
    section = payload["envelope"]
    if sum(len(points) for points in section["families"].values()) >= 2:
        written.append(_equal_time_plot(plt, section, label, title, out_dir / "equal_time.png"))
    return written


def _zoom(ax: Any, curves: list[list[float]], marks: list[float]) -> None:
    """Scale the y axis to the second half of every curve (and the ``marks``), where the arms differ;
    the first epochs, far below or above, leave the axis."""
    values = [v for c in curves for v in c[len(c) // 2 :] if v == v] + marks
    if len(values) < 2 or max(values) == min(values):
        return
    pad = (max(values) - min(values)) * 0.15
    ax.set_ylim(min(values) - pad, max(values) + pad)


def _metric_plot(
    plt: Any, payload: dict[str, Any], groups: dict[str, Any], label: str, title: str, path: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    records = [RunRecord.from_dict(r) for r in payload["runs"]]
    clock, scale, curves = payload["config"].get("clock", "work"), work_scale(records), []
    costs = {id(r): rec.curve(clock, scale) for r, rec in zip(payload["runs"], records, strict=True)}
    for k, (name, runs) in enumerate(groups.items()):
        style = {"ls": "--", "lw": 0.9, "ms": 2} if _is_budget(runs) else {"ms": 3}
        xs = _mean_of([costs[id(r)] for r in runs])
        curves.append(_mean_curve(runs, "metric")[: len(xs)])
        ax.plot(xs, curves[-1], marker=_MARKERS[k % len(_MARKERS)], label=name, **style)
    base = next((row for row in payload["summary"] if row["method"] == "baseline"), None)
    marks = []
    if base is not None and base["target"] is not None:
        ax.axhline(base["metric_mean"], color="grey", lw=0.8, ls="--")
        ax.axhspan(base["target"], base["metric_mean"], color="grey", alpha=0.12, lw=0)
        marks = [base["target"], base["metric_mean"]]
    _zoom(ax, curves, marks)
    _label(ax, AXES[clock][1], label, f"{label} vs cost: {title}", True)
    return _save(fig, path)


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def _kept_plot(plt: Any, groups: dict[str, Any], title: str, path: Path) -> Path:
    """Loaded (solid) and backpropagated (dashed) per epoch; each arm its own colour and marker and a
    small sideways offset, so an arm that keeps what another keeps is still seen."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown = [(n, r) for n, r in groups.items() if not _is_budget(r) and r[0]["num_samples"]]
    for k, (name, runs) in enumerate(shown):
        num, shift = runs[0]["num_samples"], (k - (len(shown) - 1) / 2) * 0.3 / max(len(shown), 1)
        fwd = [x / num for x in _mean_curve(runs, "loaded")]
        bwd = [x / num for x in _mean_curve(runs, "backpropagated")]
        marker, xs = _MARKERS[k % len(_MARKERS)], [i + shift for i in range(len(fwd))]
        (line,) = ax.plot(xs, fwd, marker=marker, ms=4, label=f"{name}: loaded")
        if any(abs(a - b) > 1e-9 for a, b in zip(fwd, bwd, strict=True)):
            ax.plot(xs, bwd, ls="--", marker=marker, ms=4, mfc="none", color=line.get_color(),
                    label=f"{name}: backprop")  # fmt: skip
    ax.set_ylim(0, 1.08)
    _label(
        ax,
        "epoch (each arm shifted a little sideways)",
        "share of the training set",
        f"Data kept per epoch: {title}",
    )
    return _save(fig, path)


def _histogram_plot(plt: Any, run: dict[str, Any], path: Path) -> Path:
    hists = run["histograms"]
    fig, axes = plt.subplots(1, len(hists), figsize=(max(6.5, 4 * len(hists)), 3.6), squeeze=False)
    for ax, h in zip(axes[0], hists, strict=True):
        ax.stairs(h["counts"], h["edges"], fill=True, alpha=0.6)
        ax.set_xscale("log")
        if h["threshold"] is not None:
            ax.axvline(h["threshold"], color="red", lw=1.2, label=f"threshold {h['threshold']:.3g}")
            ax.set_title(
                f"epoch {h['epoch']}: {h['below_threshold'] / max(h['num_scored'], 1):.0%} below", fontsize=10
            )
            ax.legend(fontsize=8)
        else:
            ax.set_title(f"epoch {h['epoch']}", fontsize=10)
        ax.set_xlabel("per-sample loss (score)")
    axes[0][0].set_ylabel("samples")
    fig.suptitle(f"{run['method']} (seed {run['seed']}): scores the epoch was planned from", fontsize=10)
    return _save(fig, path)


_STYLE = {
    "steps": {"color": "black", "marker": "s", "label": "baseline trained for fewer steps"},
    "batch": {
        "color": "dimgray",
        "marker": "^",
        "ls": "--",
        "label": "baseline on smaller batches, all steps",
    },
}


def _equal_time_plot(plt: Any, section: dict[str, Any], label: str, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curves = {}
    for family, pts in section["families"].items():
        pts = sorted(pts, key=lambda p: p["cost_mean"])
        curves[family] = [(p["cost_mean"], p["metric_mean"]) for p in pts]
        ax.errorbar(
            [p["cost_mean"] for p in pts], [p["metric_mean"] for p in pts], xerr=[p["cost_std"] for p in pts],
            yerr=[p["metric_std"] for p in pts], ms=4, capsize=3, lw=1.4, **_STYLE[family],
        )  # fmt: skip
    times = sorted({t for pts in curves.values() for t, _ in pts})
    if len(times) >= 2:
        grid = sorted({*times, *(times[0] + (times[-1] - times[0]) * k / 100 for k in range(101))})
        env = [
            (t, v) for t in grid if (v := envelope_at(curves, t, section.get("goal", "max"))[0]) is not None
        ]
        ax.plot(
            [t for t, _ in env],
            [v for _, v in env],
            color="gold",
            lw=7,
            alpha=0.35,
            label="envelope (best of both)",
        )
    for row in section["rows"]:
        if not row["per_seed"] or any(s["cost"] is None for s in row["per_seed"]):
            continue
        ts, ms = [s["cost"] for s in row["per_seed"]], [s["metric"] for s in row["per_seed"]]
        diff = "" if row["diff_mean"] is None else f"{row['diff_mean']:+.3g}, "
        ax.errorbar(
            [sum(ts) / len(ts)], [sum(ms) / len(ms)], xerr=[std_of(ts)], yerr=[std_of(ms)], marker="o", ms=6,
            capsize=3, ls="none", label=f"{row['method']}: {diff}{row['verdict']}",
        )  # fmt: skip
    _label(ax, AXES[section.get("clock", "work")][1], f"final {label}", f"At equal cost: {title}")
    return _save(fig, path)


def _label(ax: Any, xlabel: str, ylabel: str, title: str, outside: bool = False) -> None:
    """Axis labels, title, grid and legend (``outside``: right of the axes, where no line runs)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if outside else {}))


def _save(fig: Any, path: Path) -> Path:
    """Lay out, write (atomically) and close ``fig``."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        with atomic_open(path) as fh:
            fig.savefig(fh, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
