"""Bad input to the ``leanbatch`` command and to ``load_data``: refused in one line, never trained on.

Each class of bad input a careful user tried: data that would silently train on garbage
(non-finite pixels, mixed image modes, a test class missing from train/, a lone train/ folder,
an ambiguous array layout), a CIFAR batch that runs code while it loads, and inputs that used
to end in a traceback (device files, tiny images, string pixels, decompression bombs, bad
``micro`` options). Through the command: status 2, exactly one line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from leanbatch import cli
from leanbatch.tasks.images.data import DataError, load_data

TINY = ["--epochs", "1", "--batch-size", "8", "--methods", "baseline", "--budgets", "none"]
TINY += ["--batch-budgets", "none", "--widths", "4", "--no-plots", "--no-progress", "--threads", "1"]


pytestmark = pytest.mark.usefixtures("restore_torch_globals")


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command; assert status 2, nothing on stdout (nothing ran) and one line on stderr
    without a traceback; return that line."""
    code = cli.main(args)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    return lines[0]


def _npz(path: Path, x_train: np.ndarray, x_test: np.ndarray | None = None) -> Path:
    x_test = x_train[: max(1, len(x_train) // 4)] if x_test is None else x_test
    np.savez(
        path,
        x_train=x_train,
        y_train=np.arange(len(x_train)) % 3,
        x_test=x_test,
        y_test=np.arange(len(x_test)) % 3,
    )
    return path


def _png(path: Path, mode: str = "RGB", size: tuple[int, int] = (10, 10)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size).save(path)


# ---------------------------------------------------------------------------- silently wrong
@pytest.mark.parametrize(("split", "value", "count"), [("x_train", np.nan, 1), ("x_test", np.inf, 3)])
def test_non_finite_pixels_are_refused_with_file_split_and_count(
    split: str, value: float, count: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    x = {"x_train": rng.random((40, 8, 8)), "x_test": rng.random((10, 8, 8))}
    x[split].reshape(-1)[:count] = value
    path = _npz(tmp_path / "d.npz", x["x_train"], x["x_test"])
    with pytest.raises(DataError) as info:
        load_data(str(path))
    message = str(info.value)
    assert str(path) in message and split in message and f"{count} non-finite" in message
    line = _one_line_error(["bench", "--data", str(path), *TINY, "--out", str(tmp_path / "o")], capsys)
    assert f"{count} non-finite" in line and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--lr", "nan", "argument --lr: expected a finite number"),
        ("--lr", "inf", "argument --lr: expected a finite number"),
        ("--lr", "-0.1", "--lr must be a finite number > 0"),
        ("--momentum", "nan", "argument --momentum: expected a finite number"),
        ("--momentum", "0", "--momentum must be a finite number in (0, 1)"),
        ("--momentum", "1.5", "--momentum must be a finite number in (0, 1)"),
        ("--weight-decay", "nan", "argument --weight-decay: expected a finite number"),
        ("--weight-decay", "-1", "--weight-decay must be a finite number >= 0"),
        ("--warmup", "-inf", "argument --warmup: expected a finite number"),
        ("--warmup", "1", "--warmup must be a finite number in [0, 1)"),
        ("--tolerance", "nan", "--tolerance must be a share of the baseline's final metric like '1%'"),
        ("--tolerance", "-1%", "--tolerance must be a share of the baseline's final metric like '1%'"),
        ("--prune-ratio", "nan", "argument --prune-ratio: expected a finite number"),
        ("--delta", "inf", "argument --delta: expected a finite number"),
        ("--sb-keep", "nan", "argument --sb-keep: expected a finite number"),
        ("--sb-start", "nan", "argument --sb-start: expected a finite number"),
        ("--sb-end", "inf", "argument --sb-end: expected a finite number"),
        ("--sb-scale", "nan", "argument --sb-scale: expected a finite number"),
        ("--threads", "-1", "--threads must be an int >= 1"),
    ],
)
def test_non_finite_or_out_of_range_options_are_refused(
    option: str, value: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "--data", "digits", *TINY, f"{option}={value}", "--out", str(tmp_path / "o")]
    assert needle in _one_line_error(args, capsys)
    assert not (tmp_path / "o").exists()


def test_image_folder_of_mixed_modes_takes_the_majority_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for split, n in (("train", 6), ("test", 2)):
        for c in ("cat", "dog"):
            for i in range(n):  # one grayscale image, sorting first, in an RGB folder
                _png(
                    tmp_path / "d" / split / c / f"{i}.png",
                    "L" if (split, c, i) == ("train", "cat", 0) else "RGB",
                )
    data = load_data(str(tmp_path / "d"))
    assert data.in_channels == 3
    note = "1 of 16 images converted from grayscale to colour"
    assert any(note in n for n in data.notes) and note in data.source
    code = cli.main(["bench", "--data", str(tmp_path / "d"), *TINY, "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0 and note in out
    assert note in json.loads((tmp_path / "o" / "results.json").read_text())["data"]["source"]


def test_test_class_missing_from_train_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for split, classes in (("train", ("cat", "dog")), ("val", ("cat", "dog", "emu"))):
        for c in classes:
            for i in range(2):
                _png(tmp_path / "d" / split / c / f"{i}.png")
    with pytest.raises(DataError, match="class folder.s. emu missing from train/"):
        load_data(str(tmp_path / "d"))
    assert "emu" in _one_line_error(["bench", "--data", str(tmp_path / "d"), *TINY], capsys)


@pytest.mark.parametrize("alone", ["train", "test", "val"])
def test_a_lone_split_folder_is_not_a_class(
    alone: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for c in ("cat", "dog"):
        for i in range(5):
            _png(tmp_path / "d" / alone / c / f"{i}.png")
    missing = "train/" if alone != "train" else "test/ (or val/)"
    with pytest.raises(
        DataError, match=f"holds {alone}/ but no {missing.replace('(', '.').replace(')', '.')}"
    ):
        load_data(str(tmp_path / "d"))
    line = _one_line_error(["bench", "--data", str(tmp_path / "d"), *TINY], capsys)
    assert f"add {missing}" in line and "folder of class folders" in line
    assert load_data(str(tmp_path / "d" / alone)).num_classes == 2  # the fix the message names works


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ((40, 8, 8, 5), "neither dim 1 nor dim 3"),
        ((40, 3, 6, 4), "both dim 1 and dim 3"),
        ((40, 9, 9, 2), "neither"),
    ],
)
def test_ambiguous_4d_layouts_are_refused(
    shape: tuple[int, ...], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _npz(tmp_path / "d.npz", np.random.default_rng(0).random(shape, dtype=np.float32))
    with pytest.raises(DataError, match=needle):
        load_data(str(path))
    assert "ambiguous layout" in _one_line_error(["bench", "--data", str(path), *TINY], capsys)


@pytest.mark.parametrize(("shape", "channels"), [((20, 6, 6, 3), 3), ((20, 1, 6, 6), 1), ((20, 6, 6, 4), 4)])
def test_unambiguous_4d_layouts_still_load(shape: tuple[int, ...], channels: int, tmp_path: Path) -> None:
    data = load_data(str(_npz(tmp_path / "d.npz", np.zeros(shape, np.uint8))))
    assert data.x_train.shape[1:] == (channels, 6, 6)


# ---------------------------------------------------------------------------- executed
class _Touch:
    """Unpickling this opens (creates) ``path``: the crafted batch's payload."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


class _TouchThenData:
    """Unpickling this creates ``path`` and then returns a valid CIFAR batch, so the bench would run."""

    def __init__(self, path: Path, n: int):
        self.path, self.n = str(path), n

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        code = (
            f"(open({self.path!r}, 'w').close(), {{b'data': __import__('numpy').zeros(({self.n}, 3072), "
            f"'uint8'), b'labels': [i % 2 for i in range({self.n})]}})[1]"
        )
        return (eval, (code,))


def _cifar(root: Path, train: object, test: object, protocol: int = 5) -> Path:
    root.mkdir(parents=True)
    (root / "data_batch_1").write_bytes(pickle.dumps(train, protocol=protocol))
    (root / "test_batch").write_bytes(pickle.dumps(test, protocol=protocol))
    return root


def _batch(n: int) -> dict[bytes, Any]:
    return {
        b"data": np.zeros((n, 3072), np.uint8),
        b"labels": [i % 2 for i in range(n)],
        b"batch_label": b"x",
    }


@pytest.mark.parametrize("payload", ["touch", "touch-then-data"])
def test_crafted_cifar_batch_runs_no_code(
    payload: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    evil = _Touch(marker) if payload == "touch" else _TouchThenData(marker, 16)
    root = _cifar(tmp_path / "cifar", evil, _batch(4))
    line = _one_line_error(["bench", "--data", str(root), *TINY, "--out", str(tmp_path / "o")], capsys)
    called = "io.open" if payload == "touch" else "builtins.eval"
    assert f"data_batch_1: not loaded: refused {called}:" in line and "numpy arrays" in line
    assert not marker.exists()  # nothing was executed
    with pytest.raises(DataError, match=f"refused {called}"):
        load_data(str(root))
    assert not marker.exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_genuine_cifar_batches_load_with_every_pickle_protocol(protocol: int, tmp_path: Path) -> None:
    root = _cifar(tmp_path / "cifar-10-batches-py", _batch(6), _batch(3), protocol)
    data = load_data(str(tmp_path))
    assert data.x_train.shape == (6, 3, 32, 32) and data.num_test == 3 and data.num_classes == 2
    assert root.is_dir()


# ---------------------------------------------------------------------------- tracebacks
def test_device_files_and_fifos_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "d.npz"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        line = _one_line_error(["bench", "--data", path, *TINY, "--out", str(tmp_path / "o")], capsys)
        assert "not a regular file or a folder" in line and path in line


def test_a_folder_of_neither_layout_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d" / "docs").mkdir(parents=True)
    (tmp_path / "d" / "docs" / "notes.txt").write_text("not an image")
    (tmp_path / "d" / "data_batch_1").write_text("a CIFAR batch without its test_batch")
    assert "not a recognised layout" in _one_line_error(
        ["bench", "--data", str(tmp_path / "d"), *TINY], capsys
    )


@pytest.mark.parametrize(
    ("shape", "extra", "needle"),
    [
        ((40, 1, 1), [], "images are 1x1 but the bench needs at least 2x2"),
        ((40, 3, 3), ["--augment"], "images are 3x3 but the bench needs at least 5x5: random-crop"),
        (
            (40, 4, 4),
            ["--methods", "sb[scale_factor=0.2]"],
            "needs at least 5x5: the warm-up and the selection",
        ),
    ],
)
def test_images_too_small_for_the_model_say_the_minimum(
    shape: tuple[int, ...], extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _npz(tmp_path / "d.npz", np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
    assert needle in _one_line_error(["bench", "--data", str(path), *TINY, *extra], capsys)


@pytest.mark.parametrize(("side", "extra"), [(2, ["--methods", "baseline,sb"]), (5, ["--augment"])])
def test_images_of_the_minimum_size_train(
    side: int, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _npz(
        tmp_path / "d.npz", np.random.default_rng(0).integers(0, 256, (40, side, side), dtype=np.uint8)
    )
    assert cli.main(["bench", "--data", str(path), *TINY, *extra, "--out", str(tmp_path / "o")]) == 0


@pytest.mark.parametrize("dtype", ["<U1", "object", "complex64"])
def test_pixels_that_are_not_numbers_say_the_accepted_dtypes(
    dtype: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.full((12, 4, 4), "a" if dtype != "complex64" else 1, dtype=dtype)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x, y_train=np.zeros(12, int), x_test=x[:2], y_test=np.zeros(2, int))
    line = _one_line_error(["bench", "--data", str(path), *TINY], capsys)
    assert "x_train" in line and "uint8 0..255, another integer" in line and "float dtype" in line


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels: what PIL checks before it decodes anything."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


def test_a_decompression_bomb_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for split in ("train", "test"):
        for c in ("a", "b"):
            _png(tmp_path / "d" / split / c / "1.png")
    (tmp_path / "d" / "train" / "a" / "0.png").write_bytes(_png_header(100_000, 100_000))
    line = _one_line_error(["bench", "--data", str(tmp_path / "d"), *TINY], capsys)
    assert "train/a/0.png: cannot read image (DecompressionBombError" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["update", "--steps", "0"], "--steps must be an int >= 1, got 0"),
        (["update", "--batch-size", "0"], "--batch-size must be an int >= 1, got 0"),
        (["update", "--num-samples", "0"], "--num-samples must be an int >= 1, got 0"),
        (["update", "--num-samples", "10"], "--batch-size 128 is larger than --num-samples 10"),
        (["select", "--steps", "0"], "--steps must be an int >= 1, got 0"),
        (["select", "--batch-size", "1"], "--batch-size must be an int >= 2, got 1"),
        (["plan", "--repeats", "0"], "--repeats must be an int >= 1, got 0"),
    ],
)
def test_micro_counts_below_one_are_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in _one_line_error(["micro", *args], capsys)


@pytest.mark.parametrize("where", ["under-a-file", "a-folder", "a-device", "no-such-folder"])
def test_micro_unwritable_json_is_refused_before_it_runs(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    json_path = {
        "under-a-file": tmp_path / "file" / "m.json",
        "a-folder": tmp_path / "folder",
        "a-device": Path("/dev/null"),
        "no-such-folder": tmp_path / "nope" / "m.json",
    }[where]
    line = _one_line_error(["micro", "select", "--steps", "1", "--json", str(json_path)], capsys)
    assert line.startswith(f"leanbatch: error: cannot write --json {json_path}")
    assert Path("/dev/null").is_char_device()  # never replaced


# ---------------------------------------------------------------------------- method settings, batches
@pytest.mark.parametrize(
    ("methods", "needle"),
    [
        ("obs[pressure=inf]", "obs[pressure=inf]': pressure must be a finite number, got inf"),
        ("obs[pressure=nan]", "pressure must be a finite number, got nan"),
        ("sb[keep=nan]", "keep must be a finite number, got nan"),
        ("infobatch[delta=-inf]", "delta must be a finite number, got -inf"),
        ("ucb[c=1e999]", "c must be a finite number, got inf"),
        ("infobatch[max_weight=inf]", "max_weight must be a finite number, got inf"),
    ],
)
def test_nan_or_inf_in_brackets_is_one_line(
    methods: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "--data", "digits", *TINY, "--methods", methods, "--out", str(tmp_path / "o")]
    assert needle in _one_line_error(args, capsys)
    assert not (tmp_path / "o").exists()


def _epochs(out: Path) -> list[list[dict[str, Any]]]:
    return [run["epochs"] for run in json.loads((out / "results.json").read_text())["runs"]]


def test_a_last_batch_of_one_with_batchnorm_is_left_out_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # three stages take 8x8 digits to 1x1, where BatchNorm sees one value per channel in a batch of one
    args = ["bench", "--data", "digits", *TINY, "--widths", "4,4,4", "--limit-train", "201", "--epochs", "2"]
    assert cli.main([*args, "--methods", "baseline,sb", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "201 training samples in batches of 8 leave a last batch of one" in out
    assert (
        " ".join(out.split()).count("2 served not trained") == 2
    )  # per run (one per epoch), on the terminal
    payload = json.loads((tmp_path / "o" / "results.json").read_text())
    assert payload["config"]["task_config"]["dropped_last_batch"] is True
    baseline, sb = _epochs(tmp_path / "o")
    assert [(e["loaded"], e["dropped"], e["steps"]) for e in baseline + sb] == [(201, 1, 25)] * 4
    assert [e["forwarded"] for e in baseline] == [200, 200]  # the other 200 samples, in 25 batches of 8


def test_pruned_epochs_ending_with_a_batch_of_one_leave_it_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "--data", "digits", *TINY, "--widths", "4,4,4", "--limit-train", "200", "--epochs", "4"]
    assert (
        cli.main([*args, "--seeds", "0", "--methods", "random,infobatch", "--out", str(tmp_path / "o")]) == 0
    )
    epochs = [e for run in _epochs(tmp_path / "o") for e in run]
    assert any(e["dropped"] for e in epochs), (
        "no pruned epoch ends with a batch of one here: pick another seed"
    )
    for e in epochs:
        assert e["dropped"] == int(e["loaded"] % 8 == 1)
        assert (
            e["steps"] == -(-(e["loaded"] - e["dropped"]) // 8)
            and e["forwarded"] == e["loaded"] - e["dropped"]
        )
    assert (
        json.loads((tmp_path / "o" / "results.json").read_text())["config"]["task_config"][
            "dropped_last_batch"
        ]
        is False
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--batch-size", "1"], "--batch-size 1: the model normalises by batch statistics (BatchNorm)"),
        (["--batch-size", "3", "--methods", "sb"], "sb trains one row of a batch of 3"),
        (["--batch-size", "4", "--methods", "obs[keep=0.4]"], "obs[keep=0.4] trains one row of a batch of 4"),
        (
            ["--batch-size", "3", "--methods", "sb-proxy[keep=1]"],
            "sb-proxy[keep=1] trains one row",
        ),  # the proxy's share
    ],
)
def test_batches_batchnorm_cannot_train_are_refused(
    extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "--data", "digits", *TINY, *extra, "--out", str(tmp_path / "o")]
    assert needle in _one_line_error(args, capsys)
    assert not (tmp_path / "o").exists()


def test_small_batches_with_batchnorm_warm_up_and_train(tmp_path: Path) -> None:
    """A batch of 3: the warm-up's half batch keeps 2 samples (it was 1, and BatchNorm failed)."""
    args = [
        "bench",
        "--data",
        "digits",
        *TINY,
        "--widths",
        "4,4,4",
        "--limit-train",
        "30",
        "--batch-size",
        "3",
    ]
    assert cli.main([*args, "--methods", "baseline,sb[keep=0.7]", "--out", str(tmp_path / "o")]) == 0
