"""What is the same for every arm of the image task: :class:`TrainConfig`, and the model it builds."""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from leanbatch.checks import check_choice
from leanbatch.tasks.images.data import DataSplit
from leanbatch.tasks.images.models import CompactResNet, SmallCNN, build_model, default_model_name

__all__ = ["LR_RULES", "TrainConfig"]

# How the learning rate follows the rows a step trains (a batch budget, a selected batch): ``same``
# keeps it; ``scaled`` multiplies it by rows / batch size (the linear scaling rule). ``same`` is the
# default: measured once on --quick (seeds 0-2, SGD + Nesterov at 0.1, batch 128), the baseline on
# batches of 0.5 B and 0.7 B was 0.70 and 0.17 points more accurate with the same LR than scaled
# (a stronger, so stricter, envelope), and no selecting row did better scaled.
LR_RULES = ("same", "scaled")


@dataclass
class TrainConfig:
    """Everything that is the same for every method of a comparison.

    Example:
        >>> from leanbatch.tasks.images.data import load_data
        >>> cfg, data = TrainConfig(epochs=2), load_data("digits", 64, 16)
        >>> cfg.resolved_model(data), cfg.resolved_augment(data), cfg.batchnorm(data), cfg.as_dict()["epochs"]
        ('cnn', False, True, 2)
    """

    epochs: int = 8
    batch_size: int = 128
    lr: float = 0.1  # peak learning rate, reached after the warm-up
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    warmup: float = 0.03  # fraction of training with a linear LR warm-up, then cosine to zero
    label_smoothing: float = 0.0
    device: str = "cpu"
    model: str | None = None  # None: "cnn" for small or grayscale images, "resnet" for 32x32 RGB
    widths: tuple[int, ...] | None = None
    channels_last: bool = True
    augment: bool | None = None  # None: random crop + flip for RGB images, nothing for grayscale
    eval_batch_size: int = 1000
    # Flush denormal floats to zero on CPU (process-wide). Real data drives some activations and
    # gradients of this CNN into the denormal range, where x86 arithmetic is ~10x slower: without
    # it a step on MNIST took 110 ms instead of 12 ms here. It changes no result that matters.
    flush_denormal: bool = True
    lr_rule: str = "same"  # see LR_RULES: the LR of a step that trains fewer rows than batch_size

    def __post_init__(self) -> None:
        check_choice(self.lr_rule, "lr_rule", LR_RULES, "how a step's LR follows the rows it trains")

    def resolved_model(self, data: DataSplit) -> str:
        """The model's name: ``model``, or the default for ``data``'s images."""
        return self.model or default_model_name(data.in_channels, data.image_size)

    def resolved_augment(self, data: DataSplit) -> bool:
        """Whether batches are augmented: ``augment``, or for RGB images only."""
        return data.in_channels == 3 if self.augment is None else self.augment

    def make_model(self, data: DataSplit, widths: tuple[int, ...] | None = None) -> nn.Module:
        """A fresh model for ``data`` (``widths``: another width than the run's), on the device, in the
        memory format of the run. Its initial weights come from the global torch generator."""
        model = build_model(
            self.resolved_model(data), data.in_channels, data.num_classes, widths or self.widths
        )
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return model

    def scaled_widths(self, data: DataSplit, scale: float) -> tuple[int, ...]:
        """The model's stage widths (its defaults unless ``widths``) times ``scale``, at least 4: a
        proxy's, a holdout model's.

        Example:
            >>> from leanbatch.tasks.images.data import load_data
            >>> TrainConfig(widths=(16, 32, 64)).scaled_widths(load_data("digits", 64, 16), 0.25)
            (4, 8, 16)
        """
        cls = SmallCNN if self.resolved_model(data) == "cnn" else CompactResNet
        widths = self.widths or inspect.signature(cls).parameters["widths"].default
        return tuple(max(4, round(w * scale)) for w in widths)

    def optimizer(self, model: nn.Module) -> torch.optim.SGD:
        """The run's optimiser for ``model``: SGD at ``lr`` with the momentum, Nesterov and weight decay."""
        return torch.optim.SGD(
            model.parameters(),
            lr=self.lr,
            momentum=self.momentum,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
        )

    def batchnorm(self, data: DataSplit) -> bool:
        """Whether the run's model for ``data`` has BatchNorm (built on the meta device: no memory, no draw)."""
        with torch.device("meta"):
            model = build_model(self.resolved_model(data), data.in_channels, data.num_classes, self.widths)
        norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
        return any(isinstance(m, norms) for m in model.modules())

    def as_dict(self) -> dict[str, Any]:
        """Plain-Python values, for results.json."""
        d = asdict(self)
        d["widths"] = None if self.widths is None else list(self.widths)
        return d
