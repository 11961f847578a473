"""Loading benchmark data: built-in sets, .npz, CIFAR-10 python batches, ImageFolder, and bad layouts."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from leanbatch.tasks.images.data import DataError, load_data, looks_like_path


def test_digits_builtin_is_split_and_normalised() -> None:
    d = load_data("digits")
    assert d.x_train.shape[1:] == (1, 8, 8) and d.num_train + d.num_test == 1797
    assert d.num_classes == 10 and d.y_train.dtype == torch.int64
    assert abs(float(d.x_train.mean())) < 1e-4 and abs(float(d.x_train.std()) - 1.0) < 1e-2
    assert torch.bincount(d.y_test).min() >= 30  # stratified
    again = load_data("digits")
    assert torch.equal(d.y_train, again.y_train)  # fixed split


def test_mnist_5k_builtin() -> None:
    d = load_data("mnist-5k", limit_train=500, limit_test=100)
    assert d.x_train.shape == (500, 1, 28, 28) and d.x_test.shape == (100, 1, 28, 28)
    assert d.describe()["num_train"] == 500
    full = load_data("mnist-5k")
    assert (full.num_train, full.num_test) == (4000, 1000)


@pytest.mark.parametrize("layout", ["nhw", "nhwc", "nchw", "flat"])
def test_npz_layouts(layout: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shapes = {"nhw": (10, 6, 6), "nhwc": (10, 6, 6, 3), "nchw": (10, 3, 6, 6), "flat": (10, 36)}
    x = rng.integers(0, 256, shapes[layout], dtype=np.uint8)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x, y_train=np.arange(10) % 4, x_test=x[:5], y_test=np.arange(5) % 4)
    d = load_data(str(path))
    channels = 3 if layout in ("nhwc", "nchw") else 1
    assert d.x_train.shape == (10, channels, 6, 6) and d.num_classes == 4


def test_cifar_batches(tmp_path: Path) -> None:
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 6), ("data_batch_2", 4), ("test_batch", 3)):
        blob = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(range(n))}
        (root / name).write_bytes(pickle.dumps(blob))
    d = load_data(str(tmp_path))  # the folder that holds cifar-10-batches-py works too
    assert d.x_train.shape == (10, 3, 32, 32) and d.x_test.shape == (3, 3, 32, 32)
    assert d.num_classes == 6


def _png(path: Path, value: int, size: tuple[int, int] = (10, 10), mode: str = "RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color=value if mode == "L" else (value, value, value)).save(path)


def test_image_folder_with_train_and_test(tmp_path: Path) -> None:
    for split, n in (("train", 4), ("test", 2)):
        for c in ("cat", "dog"):
            for i in range(n):
                _png(tmp_path / split / c / f"{i}.png", 40 * i, size=(12, 12) if i else (10, 10))
    d = load_data(str(tmp_path))
    assert d.x_train.shape == (8, 3, 10, 10)  # resized to the first image's size
    assert d.num_test == 4 and d.num_classes == 2


def test_image_folder_without_split_holds_out_a_fifth(tmp_path: Path) -> None:
    for c in ("a", "b"):
        for i in range(10):
            _png(tmp_path / c / f"{i}.png", 20 * i, mode="L")
    d = load_data(str(tmp_path))
    assert d.in_channels == 1 and (d.num_train, d.num_test) == (16, 4)


def test_errors_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown dataset"):
        load_data("cifar100")
    with pytest.raises(DataError, match="does not exist"):
        load_data(str(tmp_path / "nope"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="not a recognised layout"):
        load_data(str(tmp_path / "sub"))
    path = tmp_path / "bad.npz"
    np.savez(
        path, x_train=np.zeros((4, 2, 2, 2, 2)), y_train=np.zeros(4, int), x_test=np.zeros((1, 2)), y_test=[0]
    )
    with pytest.raises(DataError, match="expected images"):
        load_data(str(path))
    np.savez(
        path, x_train=np.zeros((4, 5, 5)), y_train=np.zeros(3, int), x_test=np.zeros((1, 5, 5)), y_test=[0]
    )
    with pytest.raises(DataError, match="4 training images but 3 labels"):
        load_data(str(path))
    np.savez(
        path, x_train=np.zeros((4, 5, 5)), y_train=np.full(4, 0.5), x_test=np.zeros((1, 5, 5)), y_test=[0.5]
    )
    with pytest.raises(DataError, match="labels must be integers"):
        load_data(str(path))


def test_looks_like_path() -> None:
    assert looks_like_path("./x") and looks_like_path("data.npz") and looks_like_path("/a/b")
    assert not looks_like_path("mnist-5k") and not looks_like_path("digits")
