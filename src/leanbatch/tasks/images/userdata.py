"""Reading user data from a path: an ``.npz``, CIFAR-10 python batches, or an ImageFolder.

:func:`read_path` returns the raw arrays; :func:`leanbatch.tasks.images.data.load_data` checks and
normalises them. Every refusal is a :class:`DataError` with a one-line reason and the fix:

- a path that is neither a regular file nor a folder (a device such as ``/dev/null``, a FIFO);
- CIFAR-10 batches are pickles, and a pickle can run code while it loads: they are read with
  :class:`CifarUnpickler`, which admits only what a CIFAR batch holds (dicts, lists, bytes, str,
  int and numpy arrays) and refuses any other class or function before calling it;
- an ImageFolder whose images mix grayscale and colour is converted to the majority mode, and
  the source says how many images were converted; a test class missing from ``train/``, or a
  ``train/`` without a ``test/`` (or ``val/``), is refused;
- an unreadable image (truncated, not an image, a decompression bomb) names the file.

Example:
    >>> import io, pickle
    >>> import numpy as np
    >>> blob = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [3]})
    >>> CifarUnpickler(io.BytesIO(blob), encoding="bytes").load()[b"labels"]
    [3]
"""

from __future__ import annotations

import codecs
import contextlib
import pickle
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PIXEL_DTYPES",
    "DataError",
    "RawData",
    "CifarUnpickler",
    "RefusedPickle",
    "read_path",
    "stratified_split",
]

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
_GRAY_MODES = ("L", "1", "I;16", "I", "LA")
_SPLIT_NAMES = ("train", "test", "val")
PIXEL_DTYPES = "uint8 0..255, another integer dtype, or a float dtype"  # what images may be stored as


class DataError(ValueError):
    """The data could not be loaded: the message says why and what is expected, in one line."""


@dataclass
class RawData:
    """Arrays as read from a path, before checks and normalisation; ``notes`` say what was changed."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str
    notes: list[str] = field(default_factory=list)


def stratified_split(y: np.ndarray, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices: ``test_fraction`` of each class held out, with a fixed seed.

    Example:
        >>> tr, te = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1]), 0.25)
        >>> len(tr), len(te)
        (7, 2)
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        k = int(round(len(idx) * test_fraction))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def read_path(path: Path) -> RawData:
    """Read an ``.npz`` file, a CIFAR-10 python-batches folder or an ImageFolder at ``path``."""
    try:
        if path.is_file():
            if path.suffix == ".npz":
                return _read_npz(path)
            raise DataError(
                f"{path}: expected an .npz file or a folder (CIFAR-10 python batches or ImageFolder)"
            )
        if not path.is_dir():
            raise DataError(
                f"{path}: not a regular file or a folder (a device, FIFO or socket): give an .npz file, "
                "a CIFAR-10 python-batches folder or an ImageFolder"
            )
        for cand in (path, path / "cifar-10-batches-py"):
            if (cand / "data_batch_1").is_file() and (cand / "test_batch").is_file():
                return _read_cifar(cand)
        return _read_image_folder(path)
    except OSError as e:  # permissions, vanished files, I/O errors while listing or reading
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None


# ---------------------------------------------------------------------------- .npz
_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _read_npz(path: Path) -> RawData:
    arrays = []
    try:
        with np.load(path, allow_pickle=False) as d:
            missing = [k for k in _NPZ_KEYS if k not in d.files]
            if missing:
                raise DataError(
                    f"{path}: missing array(s) {', '.join(missing)}; an .npz needs x_train, y_train, x_test, y_test"
                )
            for k in _NPZ_KEYS:
                try:
                    arrays.append(d[k])
                except ValueError as e:
                    if "allow_pickle" not in str(e):
                        raise
                    raise DataError(
                        f"{path}: {k} holds Python objects (dtype object); pixels must be numbers: "
                        f"{PIXEL_DTYPES}, and labels integers"
                    ) from None
    except DataError:
        raise
    except Exception as e:  # corrupt zip, truncated arrays, ...
        raise DataError(f"{path}: cannot read as .npz ({type(e).__name__}: {e})") from e
    return RawData(arrays[0], arrays[1], arrays[2], arrays[3], f"{path} (.npz)")


# ---------------------------------------------------------------------------- CIFAR-10
class RefusedPickle(pickle.UnpicklingError):
    """A pickle asked for a class or function that :class:`CifarUnpickler` does not admit."""


class CifarUnpickler(pickle.Unpickler):
    """An unpickler for CIFAR-10 python batches that refuses anything a batch does not hold.

    Dicts, lists, bytes, str and int need no class lookup; numpy arrays need
    ``ndarray``/``dtype`` and numpy's array reconstructors, and bytes pickled with protocol 2
    need ``_codecs.encode``. Any other global (``os.system``, ``builtins.eval``, ...) raises
    :class:`RefusedPickle` before it is called, so a crafted file runs no code.
    """

    def find_class(self, module: str, name: str) -> Any:
        # what a pickled numpy array refers to, under numpy 1's and 2's module names
        core: Any = getattr(np, "_core", None) or np.core
        allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
        allowed[("_codecs", "encode")] = codecs.encode
        for where in ("numpy.core", "numpy._core"):
            allowed[(f"{where}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
            allowed[(f"{where}.multiarray", "scalar")] = core.multiarray.scalar
            allowed[(f"{where}.numeric", "_frombuffer")] = core.numeric._frombuffer
        if (module, name) in allowed:
            return allowed[(module, name)]
        raise RefusedPickle(
            f"refused {module}.{name}: a CIFAR-10 batch holds only dicts, lists, bytes, str, int and "
            "numpy arrays, and loading this file would call something else"
        )


def _read_cifar_batch(f: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(f, "rb") as fh:
            d = CifarUnpickler(fh, encoding="bytes").load()
    except RefusedPickle as e:
        raise DataError(f"{f}: not loaded: {e}") from None
    except Exception as e:
        raise DataError(f"{f}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None
    try:
        data = d[b"data"] if b"data" in d else d["data"]
        labels = d[b"labels"] if b"labels" in d else d["labels"]
        x = np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32)
        y = np.asarray(labels, dtype=np.int64)
    except Exception as e:
        raise DataError(
            f"{f}: not a CIFAR-10 python batch (expected a dict with 'data', N x 3072 uint8, and 'labels'; "
            f"{type(e).__name__}: {e})"
        ) from None
    return x, y


def _read_cifar(path: Path) -> RawData:
    batches = sorted(p for p in path.glob("data_batch_*") if p.is_file())
    parts = [_read_cifar_batch(b) for b in batches]
    x_te, y_te = _read_cifar_batch(path / "test_batch")
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    return RawData(x_tr, y_tr, x_te, y_te, f"{path} (CIFAR-10 python batches: {len(batches)} training files)")


# ---------------------------------------------------------------------------- ImageFolder
def _class_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES)


def _split_dirs(path: Path) -> tuple[Path, Path] | None:
    """``(train, test)`` of a split ImageFolder, None for a folder of class folders; refuses half a split."""
    sub = {p.name.lower(): p for p in _class_dirs(path)}
    test_dir = sub.get("test") or sub.get("val")
    if "train" in sub and test_dir is not None:
        return sub["train"], test_dir
    halves = [f"{sub[k].name}/" for k in _SPLIT_NAMES if k in sub]
    if halves:
        missing = "test/ (or val/)" if "train" in sub else "train/"
        raise DataError(
            f"{path}: holds {' and '.join(halves)} but no {missing}, so it is neither a split ImageFolder "
            f"nor a folder of classes: add {missing} with the same class folders, or give --data a folder "
            "of class folders (then 20% of each class is held out)"
        )
    return None


def _read_image_folder(path: Path) -> RawData:
    layout = (
        f"{path}: not a recognised layout; expected an .npz file, a CIFAR-10 python-batches folder, "
        "or an ImageFolder (train/<class>/*.png and test/<class>/*.png, or <class>/*.png)"
    )
    split_dirs = _split_dirs(path)
    if split_dirs is not None:
        train_dir, test_dir = split_dirs
        classes = [p.name for p in _class_dirs(train_dir)]
        extra = sorted({p.name for p in _class_dirs(test_dir)} - set(classes))
        if extra:
            raise DataError(
                f"{test_dir}: class folder(s) {', '.join(extra)} missing from {train_dir.name}/; every test "
                f"class needs training images (add them to {train_dir.name}/ or remove the class from "
                f"{test_dir.name}/)"
            )
        files_tr, y_tr = _list_images(train_dir, classes)
        files_te, y_te = _list_images(test_dir, classes)
        split = f"{train_dir.name}/ and {test_dir.name}/"
    else:
        classes = [p.name for p in _class_dirs(path)]
        files, y = _list_images(path, classes)
        if not files:
            raise DataError(layout)
        tr, te = stratified_split(y, 0.2)
        files_tr, y_tr = [files[i] for i in tr], y[tr]
        files_te, y_te = [files[i] for i in te], y[te]
        split = "20% of each class held out, seed 0"
    if not classes or not files_tr or not files_te:
        raise DataError(layout)
    mode, notes = _majority_mode(files_tr + files_te)
    x_tr, size, resized_tr = _read_images(files_tr, None, mode)
    x_te, _, resized_te = _read_images(files_te, size, mode)
    if resized_tr + resized_te:
        notes.append(
            f"{resized_tr + resized_te} images resized to {size[0]}x{size[1]} (the first image's size)"
        )
    source = f"{path} (ImageFolder, {len(classes)} classes, {split}{''.join('; ' + n for n in notes)})"
    return RawData(x_tr, y_tr, x_te, y_te, source, notes)


def _list_images(root: Path, classes: list[str]) -> tuple[list[Path], np.ndarray]:
    files: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        d = root / c
        found = _images_of(d) if d.is_dir() else []
        files += found
        labels += [i] * len(found)
    return files, np.asarray(labels, dtype=np.int64)


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as e:
        raise DataError("reading an ImageFolder needs Pillow: pip install pillow") from e
    return Image


def _majority_mode(files: list[Path]) -> tuple[str, list[str]]:
    """``"L"`` or ``"RGB"``, whichever most images are (ties: RGB), and a note when some are converted."""
    image = _pil()
    counts: Counter[str] = Counter()
    for f in files:
        with _opened(image, f) as im:
            counts["L" if im.mode in _GRAY_MODES else "RGB"] += 1
    mode = "L" if counts["L"] > counts["RGB"] else "RGB"
    other = "RGB" if mode == "L" else "L"
    if not counts[other]:
        return mode, []
    names = {"L": "grayscale", "RGB": "colour"}
    return mode, [
        f"{counts[other]} of {len(files)} images converted from {names[other]} to {names[mode]} "
        f"({mode}, the mode of the majority)"
    ]


@contextlib.contextmanager
def _opened(image: Any, f: Path) -> Iterator[Any]:
    """``Image.open(f)``, closed afterwards; an image PIL cannot read is a one-line :class:`DataError`."""
    try:
        with image.open(f) as im:
            yield im
    except Exception as e:  # not an image, truncated, a decompression bomb, ...
        raise DataError(f"{f}: cannot read image ({type(e).__name__}: {e})") from None


def _read_images(
    files: list[Path], size: tuple[int, int] | None, mode: str
) -> tuple[np.ndarray, tuple[int, int], int]:
    """The images as one uint8 array in ``mode``, all resized to ``size`` (default: the first's)."""
    image = _pil()
    images = []
    resized = 0
    for f in files:
        with _opened(image, f) as im:
            im = im.convert(mode)
            if size is None:
                size = im.size
            if im.size != size:
                im = im.resize(size)
                resized += 1
            images.append(np.asarray(im, dtype=np.uint8))
    assert size is not None
    return np.stack(images), size, resized
