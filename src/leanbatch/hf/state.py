"""The adapter's own state in a Trainer checkpoint: written beside the model's, read back on resume.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> load_state(folder, "x.pt", "leanbatch trainer", "its state")
    Traceback (most recent call last):
    ...
    FileNotFoundError: resume_from_checkpoint=... holds no x.pt: it was not saved by a leanbatch trainer, so its state cannot be restored
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

__all__ = ["load_state", "save_state"]


def save_state(trainer: Trainer, output_dir: str, name: str, state: Callable[[], Any]) -> None:
    """``state()`` saved as ``name`` in the checkpoint folder ``trainer`` is about to write under
    ``output_dir`` (the trainer's own ``_get_output_dir(trial)``), only where it saves: its main process."""
    if trainer.args.should_save:
        folder = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
        out = os.path.join(output_dir, folder)
        os.makedirs(out, exist_ok=True)
        torch.save(state(), os.path.join(out, name))


def load_state(checkpoint: str, name: str, saved_by: str, lost: str) -> tuple[str, Any]:
    """The path and contents of ``name`` in ``checkpoint``; a checkpoint without it (not saved by
    ``saved_by``: ``lost`` cannot be restored) raises ``FileNotFoundError`` naming both."""
    path = os.path.join(checkpoint, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"resume_from_checkpoint={checkpoint!r} holds no {name}: it was not saved by a {saved_by}, "
            f"so {lost} cannot be restored"
        )
    return path, torch.load(path, weights_only=True)
