"""PNG plots of a comparison, drawn from the results.json payload (matplotlib, no display needed).

- ``accuracy_vs_time.png``: test accuracy against training wall-clock, one line per method
  (mean over seeds at each epoch; the baseline's shorter budgets thin and dashed), with the
  baseline's final accuracy and the tolerance band.
- ``kept_per_epoch.png``: fraction of the training set forwarded and backpropagated per epoch
  (budget baselines, which keep everything, left out).
- ``loss_histograms.png``: the per-sample score distribution InfoBatch planned from at a few
  epochs, with the pruning threshold (the mean score) marked.
- ``equal_time.png``: final accuracy against training wall-clock: the baseline's two families,
  trained for fewer steps (the frontier) and on smaller batches for all its steps (mean over
  seeds, error bars = std), their envelope (the higher of the two mean curves, a wide pale line),
  every other method as a point with error bars over seeds, labelled with its paired difference
  to the envelope and verdict (the test is per seed: :mod:`~leanbatch.bench.envelope`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leanbatch.bench.files import atomic_open
from leanbatch.bench.frontier import std_of

__all__ = ["PLOT_NAMES", "write_plots"]

PLOT_NAMES = ("accuracy_vs_time.png", "kept_per_epoch.png", "loss_histograms.png", "equal_time.png")


def _mean_curve(runs: list[dict[str, Any]], key: str) -> list[float]:
    n = min(len(r["epochs"]) for r in runs)
    return [sum(r["epochs"][i][key] for r in runs) / len(runs) for i in range(n)]


def _group(payload: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in payload["runs"]:
        groups.setdefault(r["method"], []).append(r)
    return groups


def write_plots(payload: dict[str, Any], out_dir: Path) -> list[Path]:
    """Draw the plots of ``payload`` into ``out_dir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _group(payload)
    if not groups:
        return []
    title = f"{payload['data']['name']}, {payload['config']['epochs']} epochs"
    written = [
        _accuracy_plot(plt, payload, groups, title, out_dir / "accuracy_vs_time.png"),
        _kept_plot(plt, payload, groups, title, out_dir / "kept_per_epoch.png"),
    ]
    hist_run = _histogram_run(payload)
    if hist_run is not None:
        written.append(_histogram_plot(plt, hist_run, out_dir / "loss_histograms.png"))
    cpu = payload["config"].get("clock") == "cpu"
    section = payload.get("envelope_cpu" if cpu else "envelope")
    if section and sum(len(points) for points in section["families"].values()) >= 2:
        written.append(_equal_time_plot(plt, section, title, out_dir / "equal_time.png"))
    return written


def _accuracy_plot(plt: Any, payload: dict[str, Any], groups: dict[str, Any], title: str, path: Path) -> Path:
    """Test accuracy vs training wall-clock, a curve per method (budget runs dashed), the baseline's target band."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in groups.items():
        style = {"ls": "--", "lw": 0.9, "ms": 2} if _is_budget(runs) else {"ms": 3}
        ax.plot(
            _mean_curve(runs, "train_time"), _mean_curve(runs, "test_acc"), marker="o", label=label, **style
        )
    base = next((row for row in payload["summary"] if row["method"] == "baseline"), None)
    if base is not None:
        ax.axhline(base["acc_mean"], color="grey", lw=0.8, ls="--")
        ax.axhspan(base["target_acc"], base["acc_mean"], color="grey", alpha=0.12, lw=0)
    accs = [a for runs in groups.values() for a in _mean_curve(runs, "test_acc")]
    final = [row["acc_mean"] for row in payload["summary"]]
    lo = min(min(final) - 2.0, sorted(accs)[len(accs) // 4]) if accs else 0.0
    ax.set_ylim(max(lo, 0.0), min(100.0, max(accs) + 0.5))
    _label(
        ax,
        "training wall-clock (s, evaluation excluded)",
        "test accuracy (%)",
        f"Test accuracy vs time: {title}",
    )
    return _save(fig, path)


def _kept_plot(plt: Any, payload: dict[str, Any], groups: dict[str, Any], title: str, path: Path) -> Path:
    """The fraction of the data loaded (and backpropagated, where it differs) per epoch, per method."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    num = _num_train(payload)
    for label, runs in groups.items():
        if _is_budget(runs):
            continue
        fwd = [x / num for x in _mean_curve(runs, "loaded")]
        bwd = [x / num for x in _mean_curve(runs, "backpropagated")]
        epochs = list(range(len(fwd)))
        (line,) = ax.plot(epochs, fwd, marker="o", ms=3, label=f"{label}: loaded")
        if any(abs(a - b) > 1e-9 for a, b in zip(fwd, bwd, strict=True)):
            ax.plot(
                epochs, bwd, ls="--", marker="x", ms=3, color=line.get_color(), label=f"{label}: backprop"
            )
    ax.set_ylim(0, 1.05)
    _label(ax, "epoch", "fraction of the training set", f"Data kept per epoch: {title}")
    return _save(fig, path)


def _histogram_plot(plt: Any, hist_run: dict[str, Any], path: Path) -> Path:
    """The loss histograms of one pruning run, with the pruning threshold, one panel per snapshot."""
    hists = hist_run["loss_histograms"]
    fig, axes = plt.subplots(1, len(hists), figsize=(4 * len(hists), 3.6), squeeze=False)
    for ax, h in zip(axes[0], hists, strict=True):
        edges, counts = h["edges"], h["counts"]
        ax.stairs(counts, edges, fill=True, alpha=0.6)
        ax.set_xscale("log")
        if h["threshold"] is not None:
            ax.axvline(h["threshold"], color="red", lw=1.2, label=f"threshold {h['threshold']:.3g}")
            share = h["below_threshold"] / max(h["num_scored"], 1)
            ax.set_title(f"epoch {h['epoch']}: {share:.0%} below", fontsize=10)
            ax.legend(fontsize=8)
        else:
            ax.set_title(f"epoch {h['epoch']}", fontsize=10)
        ax.set_xlabel("per-sample loss (score)")
    axes[0][0].set_ylabel("samples")
    fig.suptitle(f"{hist_run['method']} (seed {hist_run['seed']}): scores the epoch was planned from")
    return _save(fig, path)


_FAMILY_STYLE = {
    "steps": {"color": "black", "marker": "s", "label": "baseline trained for fewer steps (frontier)"},
    "batch": {
        "color": "dimgray",
        "marker": "^",
        "ls": "--",
        "label": "baseline on smaller batches, all steps",
    },
}


def _equal_time_plot(plt: Any, section: dict[str, Any], title: str, path: Path) -> Path:
    """The baseline's families as lines, their envelope, each method as a point with error bars."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curves = {}
    for family, pts in section["families"].items():
        pts = sorted(pts, key=lambda p: p["train_time_s_mean"])
        curves[family] = [(p["train_time_s_mean"], p["acc_mean"]) for p in pts]
        ax.errorbar(
            [p["train_time_s_mean"] for p in pts],
            [p["acc_mean"] for p in pts],
            xerr=[p["train_time_s_std"] for p in pts],
            yerr=[p["acc_std"] for p in pts],
            ms=4,
            capsize=3,
            lw=1.4,
            **_FAMILY_STYLE[family],
        )
        for p in pts:
            share = p["budget"] if family == "steps" else p["batch"]
            ax.annotate(
                f"{share:g}", (p["train_time_s_mean"], p["acc_mean"]), textcoords="offset points",
                xytext=(4, -11), fontsize=7, color=_FAMILY_STYLE[family]["color"],
            )  # fmt: skip
    times, accs = _envelope_line(curves)
    if len(times) >= 2:
        ax.plot(times, accs, color="gold", lw=7, alpha=0.35, label="envelope (best of both)")
    for row in section["rows"]:
        times_m = [s["train_time_s"] for s in row["per_seed"]]
        accs_m = [s["acc"] for s in row["per_seed"]]
        diff = "" if row["diff_mean"] is None else f"{row['diff_mean']:+.2f} pts, "
        ax.errorbar(
            [sum(times_m) / len(times_m)],
            [sum(accs_m) / len(accs_m)],
            xerr=[std_of(times_m)],
            yerr=[std_of(accs_m)],
            marker="o",
            ms=6,
            capsize=3,
            ls="none",
            label=f"{row['method']}: {diff}{row['verdict']}",
        )
    clock = "training CPU time" if section.get("clock") == "cpu" else "training wall-clock"
    _label(
        ax, f"{clock} (s, evaluation excluded)", "final test accuracy (%)", f"Accuracy at equal time: {title}"
    )
    return _save(fig, path)


def _envelope_line(curves: dict[str, list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """The upper envelope of the families' mean curves, at their points and 100 steps between, where
    one is defined (drawn only: the verdicts compare per seed).

    Example:
        >>> t, a = _envelope_line({"steps": [(1.0, 90.0), (3.0, 96.0)], "batch": [(1.0, 92.0), (3.0, 96.0)]})
        >>> (t[0], a[0]), (t[-1], a[-1]), len(t)
        ((1.0, 92.0), (3.0, 96.0), 101)
    """
    from leanbatch.bench.envelope import envelope_at

    times = sorted({t for pts in curves.values() for t, _ in pts})
    if len(times) >= 2:
        lo, hi = times[0], times[-1]
        times = sorted({*times, *(lo + (hi - lo) * k / 100 for k in range(101))})
    points = [(t, envelope_at(curves, t)[0]) for t in times]
    kept = [(t, a) for t, a in points if a is not None]
    return [t for t, _ in kept], [a for _, a in kept]


def _is_budget(runs: list[dict[str, Any]]) -> bool:
    """A baseline trained for a budget of steps or of batch size (a point of a family of the envelope)."""
    first = runs[0]
    return first["kind"] == "baseline" and (first.get("budget", 1.0) != 1.0 or first.get("batch", 1.0) != 1.0)


def _num_train(payload: dict[str, Any]) -> int:
    return int(payload["data"]["num_train"])


def _histogram_run(payload: dict[str, Any]) -> dict[str, Any] | None:
    runs = [r for r in payload["runs"] if r["loss_histograms"]]
    for preferred in ("infobatch", "infobatch+sb", "random"):
        for r in runs:
            if r["kind"] == preferred:
                return r
    return runs[0] if runs else None


def _label(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig: Any, path: Path) -> Path:
    """Lay out, write (atomically: a unique temporary file renamed over ``path``) and close ``fig``."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        with atomic_open(path) as fh:
            fig.savefig(fh, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
