"""Faults while the ``leanbatch`` command writes: Ctrl-C, ``kill -9``, two processes, a second command.

Real processes where the fault is a process's: SIGINT to a running bench after its first seed,
SIGINT while it starts (imports, data loading), SIGKILL in the middle of writing results.json,
two benches on one ``--out`` at once. Every wait has a deadline that fails the test rather than
hanging it, and every signal is sent after the child said it reached the point under test.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from leanbatch import cli
from leanbatch.engine.judging.outputs import write_results

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = ["--data", "digits", "--epochs", "1", "--limit-train", "200", "--methods", "baseline"]
TINY += [
    "--budgets",
    "none",
    "--batch-budgets",
    "none",
    "--no-plots",
    "--no-progress",
    "--threads",
    "1",
    "--widths",
    "8",
]
OLD = {"schema": "leanbatch.bench/2", "interrupted": False, "runs": [], "note": "an earlier complete result"}
DEADLINE = 240.0  # seconds: generous on a busy two-core machine; a test past it fails, never hangs


pytestmark = pytest.mark.usefixtures("restore_torch_globals")


def _default_sigint() -> None:
    """In the child before it starts: SIGINT's default disposition.

    A background job of a non-interactive shell (CI runners, ``nohup``, ``cmd &``) starts with
    SIGINT ignored, and an ignored signal stays ignored across ``exec``: Python would then never
    install its KeyboardInterrupt handler, and these tests would test the shell, not leanbatch.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """A subprocess whose stdout lines can be awaited with a deadline (SIGINT at its default)."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None):
        env = {**os.environ, **(env or {}), "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, needle: str) -> str:
        """The first stdout line holding ``needle``; fails if the child ends or the deadline passes first."""
        while True:
            try:
                line = self.lines.get(timeout=DEADLINE)
            except queue.Empty:
                self.proc.kill()
                pytest.fail(f"no line with {needle!r} within {DEADLINE} s; saw {self.seen}")
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                pytest.fail(f"child ended without a line holding {needle!r}: {self.seen} {err}")
            self.seen.append(line)
            if needle in line:
                return line

    def finish(self) -> tuple[int, str, str]:
        """Exit status, the rest of stdout and all of stderr."""
        try:  # stdout is the reader thread's alone (communicate() would race it for the last lines)
            self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"child still running after {DEADLINE} s")
        err = self.proc.stderr.read() if self.proc.stderr else ""
        rest = []
        while (line := self.lines.get(timeout=DEADLINE)) is not None:
            rest.append(line)
        return self.proc.returncode, "".join(self.seen + rest), err


def _bench(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "leanbatch", "bench", *TINY, *extra, "--out", str(out)]


# ---------------------------------------------------------------------------- Ctrl-C
def test_a_child_answers_ctrl_c_even_when_the_suite_runs_with_sigint_ignored(tmp_path: Path) -> None:
    """The suite run as a background job (SIGINT ignored) still gives its children Python's handler."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = Child(
            [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"], tmp_path
        )
    finally:
        signal.signal(signal.SIGINT, before)
    code, out, err = child.finish()
    assert code == 0, err
    assert "default_int_handler" in out


def test_ctrl_c_after_a_seed_keeps_the_earlier_complete_result(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(OLD))
    before = (out / "results.json").read_bytes()
    child = Child(_bench(out, "--epochs", "2", "--seeds", "0,1,2,3,4,5,6,7"), tmp_path)
    child.wait_for("seed 0:")
    child.proc.send_signal(signal.SIGINT)
    code, stdout, err = child.finish()
    assert code == 130, err
    assert (out / "results.json").read_bytes() == before  # the earlier result survives
    partial = json.loads((out / "results.partial.json").read_text())
    seeds = [r["seed"] for r in partial["runs"]]
    assert partial["interrupted"] is True and seeds[0] == 0 and len(seeds) < 8
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"kept the {len(seeds)} finished run(s) in {out / 'results.partial.json'}" in err
    assert str(out / "results.partial.json") in stdout  # printed where it went


def test_a_complete_run_replaces_the_earlier_result_and_its_own_partial_saves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(json.dumps(OLD))
    assert cli.main(["bench", *TINY, "--seeds", "0,1", "--out", str(tmp_path)]) == 0
    new = json.loads((tmp_path / "results.json").read_text())
    assert new["interrupted"] is False and [r["seed"] for r in new["runs"]] == [0, 1]
    assert not (tmp_path / "results.partial.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary file left


_STARTUP_HOOK = """
import runpy, sys, time

class Stall:  # stall the first import of {module!r}, after saying so, until a signal arrives
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            print("importing {module}", flush=True)
            time.sleep(600)
        return None

sys.meta_path.insert(0, Stall())
sys.argv = ["leanbatch", *{argv!r}]
runpy.run_module("leanbatch", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["torch", "sklearn"])  # the first import, and data loading (digits)
def test_ctrl_c_during_start_up_is_one_line_and_status_130(module: str, tmp_path: Path) -> None:
    argv = ["bench", *TINY, "--out", str(tmp_path / "o")]
    child = Child([sys.executable, "-c", _STARTUP_HOOK.format(module=module, argv=argv)], tmp_path)
    child.wait_for(f"importing {module}")
    child.proc.send_signal(signal.SIGINT)
    code, _, err = child.finish()
    assert (code, err) == (130, "leanbatch: interrupted\n")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- kill -9 mid-write
_BLOCK_IN_FSYNC = """
import os, sys, time
from leanbatch.cli import main

real_fsync = os.fsync

def fsync(fd):  # the last step before the rename: a stall here is a kill in the middle of a write
    name = os.path.basename(os.readlink(f"/proc/self/fd/{{fd}}"))
    if name.startswith(".results.json."):
        print("writing " + name, flush=True)
        time.sleep(600)
    real_fsync(fd)

os.fsync = fsync
sys.exit(main({argv!r}))
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a file descriptor")
def test_kill_9_while_writing_results_leaves_the_old_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(OLD))
    before = (out / "results.json").read_bytes()
    argv = ["bench", *TINY, "--seeds", "0", "--out", str(out)]
    child = Child([sys.executable, "-c", _BLOCK_IN_FSYNC.format(argv=argv)], tmp_path)
    temp = child.wait_for("writing .results.json.").split()[-1]
    assert (out / temp).is_file()  # the new result is being written beside the old one
    child.proc.send_signal(signal.SIGKILL)
    code, _, _ = child.finish()
    assert code == -signal.SIGKILL
    assert (out / "results.json").read_bytes() == before
    partial = json.loads((out / "results.partial.json").read_text())  # the per-seed save is whole too
    assert [r["seed"] for r in partial["runs"]] == [0]


# ---------------------------------------------------------------------------- two writers
def test_two_benches_on_one_out_both_finish(tmp_path: Path) -> None:
    children = [Child(_bench(tmp_path, "--seeds", seed), tmp_path) for seed in ("0", "1")]
    results = [c.finish() for c in children]
    for code, _, err in results:
        assert code == 0, err
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["interrupted"] is False and len(payload["runs"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_write_in_flight_does_not_lose_a_second_writer_to_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A has written its temporary file; writer B writes the same target start to finish;
    then A renames. With one shared temporary name B took A's file and A's rename failed."""
    target = tmp_path / "results.json"
    real_replace = os.replace
    calls: list[Any] = []

    def replace(src: Any, dst: Any) -> None:
        calls.append(src)
        if len(calls) == 1:  # A, about to rename: B runs now
            write_results(target, {"schema": "leanbatch.bench/2", "writer": "B"})
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_results(target, {"schema": "leanbatch.bench/2", "writer": "A"})
    assert len(calls) == 2 and calls[0] != calls[1]
    assert json.loads(target.read_text())["writer"] == "A"  # the last rename wins, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_an_interrupted_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "results.json").write_text(json.dumps(OLD))

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_results(tmp_path / "results.json", {"schema": "leanbatch.bench/2"})
    assert json.loads((tmp_path / "results.json").read_text()) == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


# ---------------------------------------------------------------------------- report
@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny bench (two methods, plots) whose folder the report tests read."""
    out = tmp_path_factory.mktemp("bench")
    threads = torch.get_num_threads()
    try:
        args = ["bench", *TINY, "--methods", "baseline,infobatch", "--out", str(out)]
        assert cli.main([a for a in args if a != "--no-plots"]) == 0
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_report_of_another_json_writes_beside_it_and_touches_nothing_else(
    bench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(OLD))  # another run's result
    (folder / "other.json").write_bytes((bench_dir / "results.json").read_bytes())
    (folder / "metric_vs_time.png").write_bytes(b"another run's plot")
    before = _snapshot(folder)
    for _ in range(2):  # the second time it replaces its own output
        assert cli.main(["report", str(folder / "other.json"), "--clock", "cpu"]) == 0
        assert _snapshot(folder) == before
        report = json.loads((folder / "other.report" / "results.json").read_text())
        assert report["recomputed_from"] == str(folder / "other.json")
        assert (folder / "other.report" / "metric_vs_time.png").read_bytes()[:4] == b"\x89PNG"
    assert str(folder / "other.report" / "results.json") in capsys.readouterr().out


@pytest.mark.parametrize("case", ["into-its-own-folder", "over-another-result", "over-another-plot"])
def test_report_refuses_to_write_over_what_it_did_not_write(
    case: str, bench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    if case == "into-its-own-folder":
        target = bench_dir
    elif case == "over-another-result":
        (target / "results.json").write_text(json.dumps(OLD))
    else:
        (target / "kept_per_epoch.png").write_bytes(b"someone's plot")
    before = _snapshot(target)
    code = cli.main(["report", str(bench_dir), "--out", str(target)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "give --out a new folder" in err
    assert _snapshot(target) == before


def test_bench_refuses_an_out_whose_results_json_is_not_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text('{"my": "own file"}')
    code = cli.main(["bench", *TINY, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and "is not a leanbatch bench result" in err and "give --out a new folder" in err
    assert json.loads((tmp_path / "results.json").read_text()) == {"my": "own file"}
