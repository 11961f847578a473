"""The project's stored studies (``benchmarks/results/*/results.json``, the figures docs/results.md and
the README quote): each is schema 4, and the real ``leanbatch report`` command rebuilds it, keeping
every run and recomputing the same summary, envelope and controls the file holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanbatch import cli
from leanbatch.engine.judging.results import SCHEMA

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
STORED = sorted(RESULTS.glob("*/results.json"))
QUOTED = ("cifar10-envelope-12ep", "cifar10-envelope-20ep", "mnist-envelope-8ep")  # the README's table
KEPT = ("runs", "config", "data", "versions", "command", "tolerance", "summary", "envelope", "controls")


def test_the_stored_studies_are_there() -> None:
    assert set(QUOTED) <= {p.parent.name for p in STORED}


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.parent.name)
def test_leanbatch_report_rebuilds_each_stored_study(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = json.loads(path.read_text())
    assert stored["schema"] == SCHEMA
    code = cli.main(["report", str(path), "--out", str(tmp_path), "--no-plots", "--tables"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "vs envelope" in out and out.strip().split("\n\n")[-1].startswith("the answer (") and not err
    rebuilt = json.loads((tmp_path / "results.json").read_text())
    assert rebuilt["recomputed_from"] == str(path)
    for key in KEPT:
        assert rebuilt[key] == stored[key], key
