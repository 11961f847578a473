"""Batch-level selection in the benchmark loop: Selective Backprop, online batch selection, proxy.

:class:`Selection` is what :class:`~leanbatch.bench.train.Trainer` calls on every batch of a
selecting method (``sb``, ``infobatch+sb``, ``obs``, ``sb-proxy``).

>>> from leanbatch.bench.methods import parse_methods
>>> sel = Selection(parse_methods("sb")[0], seed=0)
>>> sel.forwards
True
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from leanbatch.bench.data import DataSplit
from leanbatch.bench.methods import MethodSpec

if TYPE_CHECKING:
    from leanbatch.bench.train import TrainConfig

__all__ = ["Selection", "proxy_widths"]


class Selection:
    """Selective Backprop for the loop: decides per batch and picks the examples to train on.

    A thin adapter over :class:`leanbatch.selection.SelectiveBackprop`: ``sb`` and ``infobatch+sb``
    use the rank rule with Composer's schedule; ``obs`` ranks by the last known loss of each index
    (no selection forward: ``forwards`` is False, and :meth:`record` stores the trained losses);
    ``sb-proxy`` keeps the hardest examples by a small proxy model trained on every batch it scores,
    with the main run's optimiser settings and learning-rate schedule. ``__call__`` returns ``None``
    on batches that train in full, else ``(x_kept, y_kept, positions, losses)``: the kept examples,
    their positions in the batch and the selection's per-example loss of every example. Selection
    leaves the model's BatchNorm statistics untouched.
    """

    def __init__(
        self, spec: MethodSpec, seed: int, data: DataSplit | None = None, cfg: TrainConfig | None = None
    ):
        from leanbatch.bench.train import _lr_factor, _make_model  # the loop's own model and schedule
        from leanbatch.selection import ProxyScorer, SelectiveBackprop

        self._lr_factor = _lr_factor

        self.forwards, self.proxy_opt, self.cfg = spec.kind != "obs", None, cfg
        if spec.kind in ("obs", "sb-proxy"):
            assert data is not None and cfg is not None
            scorer = None
            if spec.kind == "sb-proxy":
                proxy = _make_model(data, replace(cfg, widths=proxy_widths(data, cfg, spec.proxy_width)))
                self.proxy_opt = torch.optim.SGD(
                    proxy.parameters(),
                    lr=cfg.lr,
                    momentum=cfg.momentum,
                    nesterov=cfg.nesterov,
                    weight_decay=cfg.weight_decay,
                )
                scorer = ProxyScorer(
                    proxy,
                    self.proxy_opt,
                    F.cross_entropy,
                    train_every=spec.proxy_every,
                    train_keep=spec.proxy_keep,
                )
            self.sb = SelectiveBackprop(
                start=spec.sel_start,
                end=spec.sel_end,
                keep=spec.sel_keep,
                interrupt=spec.sel_interrupt,
                rule="loss_rank" if spec.kind == "obs" else "top",
                num_samples=data.num_train if spec.kind == "obs" else None,
                selection_pressure=spec.obs_pressure,
                final_pressure=spec.obs_final_pressure or None,
                scorer=scorer,
                seed=seed,
            )
            return
        self.sb = SelectiveBackprop(
            start=spec.sb_start,
            end=spec.sb_end,
            keep=spec.sb_keep,
            scale_factor=spec.sb_scale,
            interrupt=spec.sb_interrupt,
            seed=seed,
        )

    def record(self, indices: Tensor, losses: Tensor) -> None:
        """``obs``: store the trained examples' losses, which later batches are ranked by."""
        if not self.forwards:
            self.sb.record_losses(indices, losses.detach())

    def __call__(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        progress: float,
        step: int,
        indices: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        if not self.sb.is_active(progress, step):
            return None
        if self.proxy_opt is not None and self.cfg is not None:  # the proxy follows the main schedule
            for g in self.proxy_opt.param_groups:
                g["lr"] = self.cfg.lr * self._lr_factor(progress, self.cfg.warmup)
        sel = self.sb.select(
            (x, y), model, F.cross_entropy, progress=progress, batch_idx=step, indices=indices
        )
        if sel.positions is None or sel.losses is None:
            return None
        x_sel, y_sel = sel.batch
        return x_sel, y_sel, sel.positions, sel.losses


def proxy_widths(data: DataSplit, cfg: TrainConfig, scale: float) -> tuple[int, ...]:
    """The main model's stage widths (its defaults unless ``--widths``) times ``scale``, at least 4."""
    import inspect

    from leanbatch.bench.models import CompactResNet, SmallCNN

    cls = SmallCNN if cfg.resolved_model(data) == "cnn" else CompactResNet
    widths = cfg.widths or inspect.signature(cls).parameters["widths"].default
    return tuple(max(4, round(w * scale)) for w in widths)
