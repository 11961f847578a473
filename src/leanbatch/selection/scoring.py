"""The selection forward pass: per-example losses without disturbing training.

What "without disturbing" means here, and how each part is kept:

- no autograd graph: the pass runs under ``torch.no_grad()``;
- BatchNorm (any ``_NormBase``: BatchNorm1d/2d/3d, SyncBatchNorm, tracked
  InstanceNorm) running statistics and ``num_batches_tracked``: snapshotted and
  copied back after the pass, so they are bit-for-bit what they were (Composer
  updates them once more per step, on downsampled images);
- the train/eval flag of every submodule: restored one by one (a model with
  frozen BatchNorm layers keeps them frozen);
- precision: the pass runs in the caller's autocast context by default, or in
  the one given by ``autocast=``;
- memory: ``chunk_size`` splits the pass so it never holds more activations
  than a forward of ``chunk_size`` examples (no graph is kept, so a chunk costs
  less than a training step of the same size).

By default the model stays in its current mode, so the losses are those the
training step would see (batch statistics, dropout). ``eval_mode=True`` scores
with running statistics and no dropout instead. Either way dropout in train mode
draws from the global RNG like any forward pass would.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

from leanbatch.selection._checks import rankable_losses
from leanbatch.selection.batches import first_tensor, map_leaves, slice_batch

__all__ = [
    "PerExampleLoss",
    "as_per_example_loss",
    "preserved_training_state",
    "check_downsample",
    "downsample",
    "model_output",
    "compute_losses",
    "check_losses",
]

PerExampleLoss = Callable[[Any, Any], Tensor]
_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def as_per_example_loss(loss_fn: Any, name: str = "loss_fn") -> PerExampleLoss:
    """Adapt ``loss_fn`` to ``(output, target) -> per-example losses``.

    Accepts Composer's form ``loss_fn(output, target, reduction="none")`` (e.g.
    ``F.cross_entropy``) or a loss module such as ``nn.CrossEntropyLoss()``, which
    is copied with ``reduction="none"``. Raises ``TypeError`` naming ``name`` when
    the function cannot take ``reduction``.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> f = as_per_example_loss(F.cross_entropy)
        >>> f(torch.zeros(3, 4), torch.tensor([0, 1, 2])).shape
        torch.Size([3])
    """
    if isinstance(loss_fn, nn.modules.loss._Loss):
        module = copy.copy(loss_fn)  # shallow: shares weights/buffers, owns its reduction
        module.reduction = "none"
        return lambda out, target: module(out, target)
    if not callable(loss_fn):
        raise TypeError(
            f"{name} must be callable as {name}(output, target, reduction='none'), got {loss_fn!r}"
        )
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: the dry run checks instead
        params = None
    if params is not None:
        takes_reduction = any(
            p.kind is inspect.Parameter.VAR_KEYWORD
            or (p.name == "reduction" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
            for p in params
        )
        if not takes_reduction:
            raise TypeError(
                f"{name} must accept the keyword argument reduction='none' and return one loss per "
                f"example (Composer's convention), e.g. F.cross_entropy; got {loss_fn!r}"
            )
    return lambda out, target: loss_fn(out, target, reduction="none")


def _norm_buffers(model: nn.Module) -> list[Tensor]:
    bufs: list[Tensor] = []
    for m in model.modules():
        if isinstance(m, _NormBase) and m.training and m.track_running_stats:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                b = getattr(m, name, None)
                if isinstance(b, Tensor) and not isinstance(b, nn.parameter.UninitializedBuffer):
                    bufs.append(b)
    return bufs


@contextlib.contextmanager
def preserved_training_state(model: Any, eval_mode: bool = False) -> Iterator[None]:
    """Run a block without changing ``model``'s norm running statistics or train/eval flags.

    Example:
        >>> import torch
        >>> bn = torch.nn.BatchNorm1d(3).train()
        >>> with torch.no_grad(), preserved_training_state(bn):
        ...     _ = bn(torch.randn(8, 3) + 5)
        >>> bn.running_mean.tolist(), int(bn.num_batches_tracked), bn.training
        ([0.0, 0.0, 0.0], 0, True)
    """
    if not isinstance(model, nn.Module):
        if eval_mode:
            raise TypeError("eval_mode=True needs an nn.Module model (its mode is switched and restored)")
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    saved: list[tuple[Tensor, Tensor]] = []
    if eval_mode:
        model.eval()
    else:
        saved = [(b, b.clone()) for b in _norm_buffers(model)]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, copy_ in saved:
                buf.copy_(copy_)
        for m, flag in modes:
            m.training = flag


def _float_leaves(inputs: Any) -> list[Tensor]:
    found: list[Tensor] = []
    map_leaves(inputs, lambda t: found.append(t) if t.is_floating_point() else None)
    return found


def check_downsample(inputs: Any, scale_factor: float, name: str = "scale_factor") -> None:
    """Raise ``ValueError`` unless every float model input is 3-D to 5-D (and there is one).

    Integer inputs (token ids, masks) pass through undownsampled.
    """
    if scale_factor >= 1.0:
        return
    floats = _float_leaves(inputs)
    bad = [tuple(t.shape) for t in floats if t.dim() not in _MODES]
    if not floats or bad:
        raise ValueError(
            f"{name}={scale_factor} < 1 downsamples the model input spatially, which needs floating-point "
            f"inputs of 3 to 5 dimensions (batch, channels, ...); got "
            f"{bad or 'no floating-point input'}. Use {name}=1 for this data."
        )


def downsample(inputs: Any, scale_factor: float) -> Any:
    """Resize every float 3-D to 5-D input by ``scale_factor`` (linear/bilinear/trilinear)."""
    if scale_factor >= 1.0:
        return inputs

    def resize(t: Tensor) -> Tensor:
        if not t.is_floating_point() or t.dim() not in _MODES:
            return t
        return F.interpolate(
            t,
            scale_factor=scale_factor,
            mode=_MODES[t.dim()],
            align_corners=False,
            recompute_scale_factor=False,
        )

    return map_leaves(inputs, resize)


def model_output(out: Any) -> Any:
    """The prediction tensor of a model output: ``out``, ``out.logits`` / ``out["logits"]``, or ``out[0]``."""
    if isinstance(out, Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(out, Mapping) and isinstance(out.get("logits"), Tensor):
        return out["logits"]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    return out


def default_forward(model: Callable[..., Any], inputs: Any) -> Any:
    """``model(**inputs)`` for a mapping of inputs, else ``model(inputs)``."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def check_losses(losses: Any, n: int, name: str = "loss_fn") -> Tensor:
    """Raise unless ``losses`` is a real tensor of shape ``(n,)``; return it as float32.

    Integer losses are accepted (and ranked as floats), as Composer does.

    Example:
        >>> import torch
        >>> check_losses(torch.tensor([3, 1, 2]), 3)
        tensor([3., 1., 2.])
    """
    if not isinstance(losses, Tensor):
        raise TypeError(f"{name} must return a tensor of per-example losses, got {type(losses).__name__}")
    if tuple(losses.shape) != (n,):
        hint = (
            "it returned a scalar: does it honour reduction='none'?"
            if losses.dim() == 0
            else "reduce the non-batch dimensions per example (for token losses use "
            "leanbatch.per_sequence_loss)"
        )
        raise ValueError(
            f"{name} must return one loss per example, shape ({n},), got {tuple(losses.shape)}: {hint}"
        )
    return rankable_losses(losses, name).float()  # integer losses (Composer's tests) rank as floats


def _precision(
    autocast: torch.dtype | bool | None, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    if autocast is None:
        return contextlib.nullcontext()
    if autocast is False:
        return torch.autocast(device.type, enabled=False)
    if autocast is True:
        return torch.autocast(device.type)
    return torch.autocast(device.type, dtype=autocast)


def compute_losses(
    model: Callable[..., Any],
    inputs: Any,
    target: Any,
    loss: PerExampleLoss,
    n: int,
    *,
    scale_factor: float = 1.0,
    chunk_size: int | None = None,
    autocast: torch.dtype | bool | None = None,
    eval_mode: bool = False,
    forward: Callable[[Any, Any], Any] | None = None,
    name: str = "loss_fn",
) -> Tensor:
    """Per-example float32 losses of ``n`` examples from one no-grad selection pass.

    ``inputs`` is what the model takes (a tensor or a mapping of keyword inputs),
    ``target`` what the loss compares against. No host-device synchronisation.
    """
    fwd = forward or default_forward
    lead = first_tensor(inputs)
    device = lead.device if lead is not None else torch.device("cpu")
    step = n if chunk_size is None else max(1, min(chunk_size, n))
    parts: list[Tensor] = []
    with torch.no_grad(), preserved_training_state(model, eval_mode), _precision(autocast, device):
        for start in range(0, n, step):
            stop = min(n, start + step)
            x = inputs if step == n else slice_batch(inputs, start, stop, n)
            y = target if step == n else slice_batch(target, start, stop, n)
            out = model_output(fwd(model, downsample(x, scale_factor)))
            parts.append(check_losses(loss(out, y), stop - start, name))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
