"""``report.html``: the whole study in one self-contained page (tables and plots inline) to forward to a colleague.

The page (a :class:`string.Template`) has one section per question, each under its heading: the
answer (each method's verdict set apart in a box, then its table), equal work and equal time (the
envelope, the summary and this machine's wall clock, with their plots), the twins, every run, a
glossary of the columns, and the environment (leanbatch, torch and Python versions, the machine,
its load, the command). Every plot is an inline PNG (``data:`` URI) in a ``<figure>`` with its
caption: no other file, no network.

Example:
    >>> from leanbatch.engine.judging.html import SECTIONS
    >>> [s[0] for s in SECTIONS]
    ['answer', 'equal', 'twins', 'runs', 'glossary', 'environment']
"""

from __future__ import annotations

import base64
import html
import statistics
from pathlib import Path
from string import Template
from typing import Any

from leanbatch.engine.judging.records import AXES, RunRecord, work_scale
from leanbatch.engine.judging.tables import (
    answers,
    format_answer,
    format_controls,
    format_envelope,
    format_realisation,
    format_summary,
    tolerance_text,
)

__all__ = ["GLOSSARY", "SECTIONS", "render"]

SECTIONS = (
    ("answer", "The answer"),
    ("equal", "Equal work and equal time"),
    ("twins", "The twins"),
    ("runs", "Every run"),
    ("glossary", "Glossary of the columns"),
    ("environment", "Environment"),
)

GLOSSARY = (
    (
        "work",
        "a run's FLOP-weighted passes (a training forward 1, a backward 2, a selection pass "
        "scale_factor² of a forward), as a share of the full baseline's",
    ),
    (
        "work saved, time saved",
        "1 - the arm's cost / the full baseline's: positive when the arm cost "
        "less, negative when it cost more (one convention in every table)",
    ),
    (
        "fwd, bwd",
        "samples forwarded (selection passes included) and backpropagated, as a share of the full run's",
    ),
    ("ideal x", "the full baseline's work / the arm's: the speed-up if time followed the work"),
    ("actual x", "the full baseline's training wall-clock / the arm's, paired by seed (this machine)"),
    ("achieved", "actual x / ideal x: how much of the ideal saving became time on this machine"),
    ("cpu x", "actual x in the process's CPU time"),
    (
        "t->target",
        "the cost until the metric first came within the tolerance of the baseline's final "
        "mean, in the goal's direction; '- (k/n)': only k of n seeds reached it",
    ),
    (
        "envelope",
        "per seed, the best of the baseline trained for fewer steps (steps) and on smaller "
        "batches (batch) at the arm's own cost, never extrapolated",
    ),
    (
        "vs envelope, vs twin",
        "mean ± std over seeds of the paired differences (arm minus reference, in the metric's units)",
    ),
    ("95% CI", "the 95% Student-t confidence interval of the mean difference"),
    (
        "verdict",
        "better / worse only when the CI of the gain excludes 0 and |mean| > std; on: a tie "
        "within noise; undecided: one seed; out of range: cheaper or costlier than every baseline run",
    ),
    ("twin", "the same budget spent at random (infobatch: random; sb: uniform...): what the choosing buys"),
)

_CAPTIONS = {
    "equal_time": "Final metric against cost: the baseline's two families (fewer steps, smaller batches), "
    "their envelope (gold) and every other arm (mean ± std over seeds), labelled with its difference to "
    "the envelope and its verdict.",
    "metric_vs_time": "The metric at each evaluation against the cost so far (mean over seeds), the "
    "baseline's final value (dashed) and the tolerance band (grey); the y axis shows the second half of "
    "training, where the arms differ.",
    "kept_per_epoch": "The share of the training set loaded (solid) and backpropagated (dashed) per epoch, "
    "each arm with its own marker and a small sideways offset, so no series hides another.",
    "loss_histograms": "The per-sample scores a pruning method planned its epochs from, with its threshold.",
}

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222;line-height:1.4}
h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.88rem}
td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:right}td:first-child,th:first-child{text-align:left}
th{background:#f3f3f3}p.note{font-size:.85rem;color:#555}code{background:#f3f3f3;padding:.1rem .3rem}
figure{margin:1rem 0}figure img{max-width:100%}figcaption{font-size:.85rem;color:#444;max-width:48rem}
.verdict{border-left:.5rem solid #999;background:#f7f7f7;padding:.6rem 1rem;margin:.6rem 0;font-size:1.05rem}
.verdict.pays{border-color:#2e7d32;background:#edf7ee}.verdict.worse{border-color:#c62828;background:#fbeeee}
.verdict.tie{border-color:#f9a825;background:#fdf8e6}.verdict p{margin:.2rem 0;font-size:.9rem}
dt{font-weight:600}dd{margin:0 0 .4rem 1.5rem}
"""

_PAGE = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>leanbatch report: $title</title><style>$style</style></head>
<body>
<h1>leanbatch: did skipping the work pay? <small>($title)</small></h1>
$commands
<section id="answer"><h2>The answer</h2>
$verdicts
$answer
</section>
<section id="equal"><h2>Equal work and equal time</h2>
<p>Each arm against the best plain use of its cost ($clock clock): the baseline trained for fewer steps or on
smaller batches. Then every arm's figures, and what the saving became on this machine's wall clock.</p>
$envelope
$equal_figures
$summary
$realisation
</section>
<section id="twins"><h2>The twins</h2>
<p>Each method against its uniform twin, the same budget spent at random: what the choosing buys.</p>
$twins
</section>
<section id="runs"><h2>Every run</h2>
$runs
$run_figures
</section>
<section id="glossary"><h2>Glossary of the columns</h2>
<dl>$glossary</dl>
</section>
<section id="environment"><h2>Environment</h2>
<table>$environment</table>
</section>
</body></html>
""")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _blocks(text: str) -> str:
    """A terminal table's text as HTML: its Markdown table as a table, the rest as notes."""
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        rows = [ln for ln in lines if ln.lstrip().startswith("|")]
        out += [f'<p class="note">{html.escape(n)}</p>' for n in lines if not n.lstrip().startswith("|")]
        if rows:
            out.append(_table(_cells(rows[0]), [_cells(r) for r in rows[2:]]))
    return "\n".join(out)


def _table(head: list[str], body: list[list[Any]]) -> str:
    rows = ["<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in body]
    return "<table>" + "".join(rows) + "</table>"


def _verdicts(payload: dict[str, Any]) -> str:
    """Each method's verdict in a box of its own, coloured by what it says."""
    boxes = []
    for row, env, twin, says in answers(payload):
        env_text = "none" if env is None else str(env["verdict"])
        tone = {"better": "pays", "worse": "worse", "on": "tie"}.get(env_text, "open")  # what overall() says
        twin_text = (
            "no twin ran" if twin is None else f"against its twin {twin['control']}: {twin['verdict']}"
        )
        boxes.append(
            f'<div class="verdict {tone}"><strong>{html.escape(row["method"])}</strong>: {html.escape(says)}'
            f"<p>envelope: {html.escape(env_text)}; {html.escape(twin_text)}</p></div>"
        )
    return "\n".join(boxes) or "<p>No method but the baseline ran.</p>"


def _figure(plot: Path) -> str:
    data = base64.b64encode(plot.read_bytes()).decode("ascii")
    caption = _CAPTIONS.get(plot.stem, plot.stem)
    return (f'<figure><img alt="{html.escape(plot.stem)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")  # fmt: skip


def _runs(payload: dict[str, Any]) -> str:
    """Every run in one table: its arm, seed, metric, cost on the study's clock, time and work."""
    records = [RunRecord.from_dict(r) for r in payload["runs"]]
    clock, scale = payload["config"].get("clock", "work"), work_scale(records)
    head, _, spec = AXES[clock]
    metric = payload["config"].get("metric", "metric")
    body = []
    for r in sorted(records, key=lambda r: (r.method, r.seed)):
        t, cost = r.totals(), r.cost(clock, scale)
        body.append([r.method, r.seed, f"{r.metric:.4g}", "-" if cost is None else format(cost, spec),
                     f"{r.train_time_s:.1f}", *("-" if t[k] is None else f"{t[k]:.2f}" for k in
                     ("forward_fraction", "backward_fraction")), len(r.epochs)])  # fmt: skip
    cols = ["method", "seed", metric, head, "time s", "fwd", "bwd", "evaluations"]
    return _table(cols, body) if body else "<p>No run finished.</p>"


def _environment(payload: dict[str, Any]) -> str:
    v, runs = payload.get("versions") or {}, payload["runs"]
    loads = [x for r in runs for x in r.get("load_avg") or []]
    command = payload.get("command")
    rows = [
        ("leanbatch", v.get("leanbatch")), ("torch", v.get("torch")), ("Python", v.get("python")),
        ("machine", f"{v.get('platform', '?')}, {v.get('processor', '?')}, torch threads {v.get('torch_threads', '?')}"
         + (f", {v['gpu']} (CUDA {v.get('cuda')})" if v.get("gpu") else "")),
        ("load", f"1-minute load average {statistics.fmean(loads):.2f} (mean over the runs' epochs), max "
         f"{max(loads):.2f}" if loads else "not recorded"),
        ("command", "; ".join(command) if isinstance(command, list) else command or "leanbatch"),
        ("data", payload["data"].get("name", "?")), ("seeds", payload["config"].get("seeds")),
        ("tolerance", tolerance_text(payload["tolerance"], payload["config"].get("metric", "metric"))),
    ]  # fmt: skip
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(x))}</td></tr>" for k, x in rows)


def render(payload: dict[str, Any], plots: list[Path]) -> str:
    """The page of the results.json ``payload``, with the ``plots`` inline under their captions."""
    cfg = payload["config"]
    command = payload.get("command")
    commands = command if isinstance(command, list) else [command or "leanbatch"]
    figures = {p.stem: _figure(p) for p in plots}
    return _PAGE.substitute(
        title=html.escape(str(payload["data"].get("name", cfg.get("task", "")))),
        style=_STYLE, clock=cfg.get("clock", "work"),
        commands="\n".join(f"<p><code>{html.escape(str(c))}</code></p>" for c in commands),
        verdicts=_verdicts(payload), answer=_blocks(format_answer(payload)),
        envelope=_blocks(format_envelope(payload)),
        equal_figures="\n".join(figures[k] for k in ("equal_time", "metric_vs_time") if k in figures),
        summary=_blocks(format_summary(payload)),
        realisation=_blocks(format_realisation(payload)),
        twins=_blocks(format_controls(payload)) if payload["controls"]["rows"] else
        "<p>No twin ran (add --controls, or a method's twin to --methods).</p>",
        runs=_runs(payload),
        run_figures="\n".join(figures[k] for k in ("kept_per_epoch", "loss_histograms") if k in figures),
        glossary="".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(d)}</dd>" for k, d in GLOSSARY),
        environment=_environment(payload),
    )  # fmt: skip
