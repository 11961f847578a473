"""What ``leanbatch bench`` shows: the answer last, short and no wider than the terminal (a real
study at ``COLUMNS=100``), the full tables behind ``--tables``, a method paired with its twin
whenever the twin ran, one sign for savings, a scale-free tolerance, the progress bar, ``--help``
with its examples, the plots (no series hidden, the method's own scores, the metric zoomed) and
report.html (its sections, captions, glossary and environment; parsed here, and read by a real
headless browser where Debian's chromium is installed)."""

from __future__ import annotations

import html.parser
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from leanbatch import cli
from leanbatch.engine.judging import plots
from leanbatch.engine.judging.html import GLOSSARY, SECTIONS
from leanbatch.engine.study import bench

TASKS = Path(__file__).resolve().parent / "engine_tasks.py"
STUDY = ["--task", f"{TASKS}:train", "--methods", "baseline,random,infobatch", "--seeds", "0,1",
         "--budgets", "0.5,1", "--batch-budgets", "none", "--threads", "1", "--no-progress"]  # fmt: skip


def _main(args: list[str], columns: int = 100) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", str(columns))
        mp.setattr(sys, "stdout", out)
        mp.setattr(sys, "stderr", err)
        try:
            code = cli.main(args)
        finally:
            torch.set_num_threads(threads)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One real study (a small MLP, two seeds, infobatch beside its twin random), at 100 columns."""
    out = tmp_path_factory.mktemp("study")
    code, text, err = _main(["bench", *STUDY, "--out", str(out)])
    assert code == 0, err
    return text, out


def test_the_answer_is_the_last_block_and_no_line_is_wider_than_the_terminal(study: tuple[str, Path]) -> None:
    text, out = study
    blocks = text.strip().split("\n\n")
    answer = blocks[-1].splitlines()
    assert answer[0].startswith("the answer (metric, higher is better; 2 seed(s); work clock)")
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "| method" not in text  # the full tables are not printed by default
    assert any(ln.strip().startswith("infobatch:") for ln in answer)
    assert str(out / "report.html") in " ".join(answer).replace("\n", "") or "report.html" in answer[-1]
    runs = [ln for ln in text.splitlines() if " seed " in ln and ": metric " in ln]
    assert len(runs) == 8 and all(ln.startswith("  ") for ln in runs)  # 4 arms x 2 seeds, before the answer
    assert text.index(runs[-1]) < text.index("the answer (")


def test_a_narrow_terminal_wraps_the_answer(study: tuple[str, Path], tmp_path: Path) -> None:
    code, text, _ = _main(["report", str(study[1]), "--out", str(tmp_path / "r"), "--no-plots"], columns=50)
    answer = text.strip().split("\n\n")[-1].splitlines()
    whole = str(tmp_path / "r" / "results.json")  # longer than 50: a path is kept whole, on a line of its own
    assert code == 0 and whole in answer and all(len(line) <= 50 for line in answer if line != whole)


def test_tables_prints_every_table_before_the_answer(study: tuple[str, Path], tmp_path: Path) -> None:
    code, text, _ = _main(["report", str(study[1]), "--out", str(tmp_path / "r"), "--no-plots", "--tables"])
    assert code == 0 and text.strip().split("\n\n")[-1].startswith("the answer (")
    heads = [ln for ln in text.splitlines() if ln.startswith("| method")]
    assert len(heads) == 5  # the answer's table, the realisation, the summary, the envelope, the twins
    assert text.index("| method") < text.index("the answer (")


def test_a_method_is_paired_with_its_twin_whenever_the_twin_ran(study: tuple[str, Path]) -> None:
    text, out = study
    payload = json.loads((out / "results.json").read_text())
    assert [(r["method"], r["control"]) for r in payload["controls"]["rows"]] == [("infobatch", "random")]
    answer = text.strip().split("\n\n")[-1]
    infobatch = answer[answer.index("  infobatch:") :]
    assert "vs its twin random" in infobatch and "no twin" not in infobatch


def test_time_saved_has_one_sign_in_every_table(study: tuple[str, Path], tmp_path: Path) -> None:
    _, text, _ = _main(["report", str(study[1]), "--out", str(tmp_path / "r"), "--no-plots", "--tables"])
    rows = [ln.split("|") for ln in text.splitlines() if ln.startswith("| baseline[budget=0.5]")]
    summary, realisation = [r for r in rows if len(r) == 10], [r for r in rows if len(r) == 8]
    assert summary[0][4].strip() == "50.0%"  # half the work saved: positive, as in the answer
    assert "work saved" in text and "| vs base" not in text
    payload = json.loads((study[1] / "results.json").read_text())
    ratio = next(
        r["time_ratio_vs_baseline"] for r in payload["summary"] if r["method"] == "baseline[budget=0.5]"
    )
    assert (
        realisation[0][3].strip() == f"{(1 - ratio) * 100:.1f}%"
    )  # the same sign: 1 - the arm's / the baseline's
    answer = text.strip().split("\n\n")[-1]
    row = next(r for r in payload["summary"] if r["method"] == "infobatch")
    assert f"work saved {(1 - row['cost_ratio_vs_baseline']) * 100:.1f}%" in answer
    assert f"time saved on this machine {(1 - row['time_ratio_vs_baseline']) * 100:.1f}%" in " ".join(
        answer.split()
    )


def _counting(run: Any) -> float:
    """Two epochs over 32 numbers; the metric 0.25, then 0.5 (the same for every arm)."""
    ds = run.wrap(torch.arange(32.0), num_epochs=2)
    for epoch in range(ds.epoch, 2):
        ds.set_epoch(epoch)
        for x in torch.utils.data.DataLoader(ds, batch_size=run.batch_size(8), sampler=ds.sampler):
            ds.update(x)
        run.log(epoch=epoch, metric=0.25 * (epoch + 1))
    return 0.5


def test_the_default_tolerance_is_a_share_of_the_baselines_metric() -> None:
    report = bench(_counting, methods="baseline", budgets=[], batch_budgets=[])
    base = report["summary"][0]
    assert report["tolerance"] == "1%" and base["target"] == pytest.approx(0.495)
    assert "1% of the baseline's final metric" in report.text
    absolute = bench(_counting, methods="baseline", budgets=[], batch_budgets=[], tolerance=0.3)
    assert absolute["tolerance"] == 0.3 and absolute["summary"][0]["target"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="tolerance must be a share"):
        bench(_counting, methods="baseline", tolerance="x%")


def test_progress_shows_runs_done_elapsed_and_eta(capsys: pytest.CaptureFixture[str]) -> None:
    bench(_counting, methods="baseline,random", seeds=[0, 1], budgets=[], batch_budgets=[], progress=True)
    err = capsys.readouterr().err
    assert "4 of 4 runs done" in err and "elapsed, ETA" in err and "seed 1 epoch 1, metric 0.5" in err
    bench(_counting, methods="baseline", budgets=[], batch_budgets=[])
    assert capsys.readouterr().err == ""


def test_help_has_examples_fits_100_columns_and_says_to_quote_brackets() -> None:
    code, text, _ = _main(["bench", "--help"])
    assert code == 0 and max(len(line) for line in text.splitlines()) <= 100
    wide = _main(["bench", "--help"], columns=250)[1]  # a wide terminal: still 100 at most
    assert max(len(line) for line in wide.splitlines()) <= 100
    assert (
        "examples:" in text
        and "leanbatch bench --quick" in text
        and "'baseline,infobatch,obs[keep=0.7]'" in text
    )
    assert "Quote a method with brackets in a shell: 'baseline[budget=0.5]'" in text


def test_the_plots_hide_no_series_show_the_methods_scores_and_zoom_the_metric(
    study: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    payload = json.loads((study[1] / "results.json").read_text())
    twice = [{**r, "method": "random again"} for r in payload["runs"] if r["method"] == "random"]
    payload["runs"] += twice  # an arm that keeps exactly what another keeps
    drawn: dict[str, Any] = {}

    def keep(fig: Any, path: Path) -> Path:
        drawn[path.name] = fig
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plots.write_plots(payload, tmp_path)
    kept = drawn["kept_per_epoch.png"].axes[0].get_lines()
    series = [(tuple(ln.get_xdata()), tuple(ln.get_ydata())) for ln in kept]
    assert len(kept) >= 3 and len(set(series)) == len(series)  # no two series on the same points
    assert len({ln.get_marker() for ln in kept if ln.get_linestyle() == "-"}) == len(
        [ln for ln in kept if ln.get_linestyle() == "-"]
    )
    assert "infobatch" in drawn["loss_histograms.png"]._suptitle.get_text()
    ax = drawn["metric_vs_time.png"].axes[0]
    starts: dict[str, list[float]] = {}
    for r in payload["runs"]:
        starts.setdefault(r["method"], []).append(r["epochs"][0]["metric"])
    first = min(sum(v) / len(v) for v in starts.values())  # the lowest point drawn: an arm's first mean
    finals = [row["metric_mean"] for row in payload["summary"]]
    assert ax.get_ylim()[0] > first  # the first epochs, far below, leave the axis
    assert (
        ax.get_ylim()[0] <= min(payload["summary"][0]["target"], *finals) <= max(finals) <= ax.get_ylim()[1]
    )


class _Page(html.parser.HTMLParser):
    """What a reader sees of report.html: headings by section, captions, glossary terms, environment rows."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.section = ""
        self.found: dict[str, list[str]] = {
            "h2": [],
            "figcaption": [],
            "dt": [],
            "th": [],
            "img": [],
            "section": [],
        }
        self.verdicts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.stack.append(tag)
        if tag == "section":
            self.found["section"].append(str(a.get("id")))
        if tag == "img":
            self.found["img"].append(str(a.get("alt")))
        if tag == "div" and "verdict" in str(a.get("class", "")).split():
            self.verdicts += 1

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] in self.found and data.strip():
            self.found[self.stack[-1]].append(data.strip())


def _check_page(dom: str) -> None:
    page = _Page()
    page.feed(dom)
    f = page.found
    assert f["section"] == [s for s, _ in SECTIONS] and f["h2"] == [h for _, h in SECTIONS]
    assert len(f["img"]) == 4 and len(f["figcaption"]) == 4 and all(len(c) > 40 for c in f["figcaption"])
    assert f["dt"] == [k for k, _ in GLOSSARY] and {"ideal x", "achieved", "t->target"} <= set(f["dt"])
    env = " ".join(f["th"])
    assert all(k in env for k in ("leanbatch", "torch", "Python", "machine", "load", "command"))
    assert (
        torch.__version__ in dom and "leanbatch bench --task" in dom and page.verdicts == 2
    )  # random and infobatch


def test_report_html_has_its_sections_captions_glossary_and_environment(study: tuple[str, Path]) -> None:
    _check_page((study[1] / "report.html").read_text())


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_report_html_read_by_a_headless_browser(study: tuple[str, Path], tmp_path: Path) -> None:
    page = (study[1] / "report.html").resolve()
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
         "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "<figcaption>" in dom  # the page as the browser built it
    _check_page(dom)
