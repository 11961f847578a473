"""The selection forward's parts (run by :class:`~leanbatch.selection.ForwardScores`): per-example
losses without disturbing training, and the loss checks.

"Without disturbing" means: no autograd graph (``torch.no_grad()``); the running statistics and
``num_batches_tracked`` of every BatchNorm-like layer (any ``_NormBase``) copied back after the
pass; every submodule's train/eval flag restored one by one (frozen BatchNorm stays frozen);
precision from the caller's autocast context or ``autocast=``; memory capped by ``chunk_size``.
By default the model keeps its mode (batch statistics, dropout, as the training step sees it);
``eval_mode=True`` scores with running statistics and no dropout instead.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

from leanbatch.selection.batches import map_leaves

PerExampleLoss = Callable[[Any, Any], Tensor]
_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def _takes_reduction(fn: Any) -> bool | None:
    """Whether ``fn`` can take ``reduction=`` (``None``: no signature to read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "reduction" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in params
    )


def as_per_example_loss(loss_fn: Any, name: str = "loss_fn") -> PerExampleLoss:
    """Adapt ``loss_fn`` to ``(output, target) -> per-example losses``.

    Accepts Composer's form ``loss_fn(output, target, reduction="none")`` (e.g. ``F.cross_entropy``)
    or a loss module such as ``nn.CrossEntropyLoss()`` (copied with ``reduction="none"``); a
    ``TypeError`` naming ``name`` when the function cannot take ``reduction``.
    """
    if isinstance(loss_fn, nn.modules.loss._Loss):
        module = copy.copy(loss_fn)  # shallow: shares weights/buffers, owns its reduction
        module.reduction = "none"
        return lambda out, target: module(out, target)
    if not callable(loss_fn):
        raise TypeError(
            f"{name} must be callable as {name}(output, target, reduction='none'), got {loss_fn!r}"
        )
    if _takes_reduction(loss_fn) is False:  # None: a builtin without a signature, the dry run checks
        raise TypeError(
            f"{name} must accept the keyword argument reduction='none' and return one loss per "
            f"example (Composer's convention), e.g. F.cross_entropy; got {loss_fn!r}"
        )
    return lambda out, target: loss_fn(out, target, reduction="none")


def _is_loss(fn: Any) -> bool:
    """A loss module, or a function (not a module) with a ``reduction`` parameter, e.g. ``F.cross_entropy``."""
    if isinstance(fn, nn.modules.loss._Loss):
        return True
    if isinstance(fn, nn.Module) or not callable(fn):
        return False
    try:
        return "reduction" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _is_network(fn: Any) -> bool:
    """A module that is no loss module and whose ``forward`` takes one input and no ``reduction=``
    (a loss takes ``output, target``): a model, e.g. ``nn.Linear`` or ``nn.Sequential``."""
    if not isinstance(fn, nn.Module) or isinstance(fn, nn.modules.loss._Loss):
        return False
    try:
        params = inspect.signature(fn.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    return len(required) < 2 and _takes_reduction(fn.forward) is False


def check_model(model: Any, loss_fn: Any, loss_name: str = "loss_fn", custom_forward: bool = False) -> None:
    """Raise ``TypeError`` when ``model`` is missing or is a loss, or ``model`` and ``loss_fn`` look swapped.

    A plain callable ``model`` (``lambda X: hf_model(**X)``) and a loss module with parameters
    whose forward takes ``reduction=`` are accepted. ``custom_forward``: a ``forward_fn`` calls
    the model, so ``model`` may be anything it takes (even ``None``).
    """

    def what(fn: Any) -> str:
        return getattr(fn, "__name__", None) or type(fn).__name__

    if not custom_forward and (model is None or not callable(model)):
        raise TypeError(
            f"model must be the model being trained (an nn.Module, or a callable model(inputs)), got {model!r}"
        )
    if _is_network(loss_fn) and (not isinstance(model, nn.Module) or _is_loss(model)):
        kind = "a loss" if _is_loss(model) else "not an nn.Module"
        raise TypeError(
            f"model and {loss_name} look swapped: model is {what(model)} ({kind}) and "
            f"{loss_name} is the network {what(loss_fn)}; pass the model being trained first, then the "
            f"loss: (..., model, {loss_name}, ...)"
        )
    if _is_loss(model):
        raise TypeError(
            f"model is {what(model)}, a loss function: pass the model being trained as model, and the "
            f"loss as {loss_name}"
        )
    if _is_network(loss_fn):
        raise TypeError(
            f"{loss_name} is the network {what(loss_fn)}, whose forward takes no reduction=: pass a loss "
            f"{loss_name}(output, target, reduction='none'), e.g. F.cross_entropy, and the network as model"
        )


def rankable_losses(losses: Tensor, name: str) -> Tensor:
    """``losses`` as floats to rank: integer losses become float32 (Composer's tests rank
    ``torch.ones_like(target)``), float ones pass unchanged; bool and complex are refused.
    """
    if losses.dtype == torch.bool or losses.is_complex():
        raise TypeError(
            f"{name} must return real per-example losses (float or integer), got {losses.dtype}: "
            "a bool or complex tensor cannot be ranked"
        )
    return losses if losses.is_floating_point() else losses.float()


def check_losses(losses: Any, n: int, name: str = "loss_fn") -> Tensor:
    """Raise unless ``losses`` is a real tensor of shape ``(n,)``; return it as float32."""
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
    return rankable_losses(losses, name).float()


@contextlib.contextmanager
def preserved_training_state(model: Any, eval_mode: bool = False) -> Iterator[None]:
    """Run a block without changing ``model``'s norm running statistics or train/eval flags."""
    if not isinstance(model, nn.Module):
        if eval_mode:
            raise TypeError("eval_mode=True needs an nn.Module model (its mode is switched and restored)")
        yield
        return
    modes: list[tuple[nn.Module, bool]] = []
    saved: list[tuple[Tensor, Tensor]] = []  # the running statistics of norm layers that update them
    for m in model.modules():
        modes.append((m, m.training))
        if not eval_mode and isinstance(m, _NormBase) and m.training and m.track_running_stats:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                b = getattr(m, name, None)
                if isinstance(b, Tensor) and not isinstance(b, nn.parameter.UninitializedBuffer):
                    saved.append((b, b.clone()))
    if eval_mode:
        model.eval()
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, copy_ in saved:
                buf.copy_(copy_)
        for m, flag in modes:
            m.training = flag


def _check_size(t: Tensor, scale_factor: float) -> None:
    """Raise unless every spatial dimension of ``t`` keeps at least one pixel at ``scale_factor``."""
    smallest = min(t.shape[2:])
    if math.floor(float(smallest) * scale_factor) >= 1:  # F.interpolate's own output-size rule
        return
    usable = 1.0 / smallest
    if math.floor(float(smallest) * usable) < 1:
        usable = math.nextafter(usable, 2.0)
    raise ValueError(
        f"scale_factor={scale_factor} would downsample the input of shape {tuple(t.shape)} to 0 pixels "
        f"along its {smallest}-pixel dimension: the smallest usable scale_factor for it is {usable:.6g} "
        f"(1 / {smallest})"
    )


def check_downsample(inputs: Any, scale_factor: float) -> None:
    """Raise ``ValueError`` unless ``inputs`` can be downsampled by ``scale_factor``.

    Below 1 there must be a float input, every float input must be 3-D to 5-D (integer inputs,
    token ids and masks, pass through), and each keeps at least one pixel per dimension.
    """
    if scale_factor >= 1.0:
        return
    floats: list[Tensor] = []
    map_leaves(inputs, lambda t: floats.append(t) if t.is_floating_point() else None)
    bad = [tuple(t.shape) for t in floats if t.dim() not in _MODES]
    if not floats or bad:
        raise ValueError(
            f"scale_factor={scale_factor} < 1 downsamples the model input spatially, which needs "
            f"floating-point inputs of 3 to 5 dimensions (batch, channels, ...); got "
            f"{bad or 'no floating-point input'}. Use scale_factor=1 for this data."
        )
    for t in floats:
        _check_size(t, scale_factor)


def downsample(inputs: Any, scale_factor: float) -> Any:
    """Resize every float 3-D to 5-D input by ``scale_factor`` (linear/bilinear/trilinear).

    Example:
        >>> import torch
        >>> downsample({"x": torch.zeros(2, 1, 8, 8), "ids": torch.zeros(2, 5)}, 0.5)["x"].shape
        torch.Size([2, 1, 4, 4])
    """
    if scale_factor >= 1.0:
        return inputs

    def resize(t: Tensor) -> Tensor:
        if not t.is_floating_point() or t.dim() not in _MODES:
            return t
        _check_size(t, scale_factor)  # a clear error before the forward, not interpolate's
        return F.interpolate(
            t,
            scale_factor=scale_factor,
            mode=_MODES[t.dim()],
            align_corners=False,
            recompute_scale_factor=False,
        )

    return map_leaves(inputs, resize)


def _float_shapes(inputs: Any) -> str:
    """The shapes, batch dimension as ``N``, of the float 3-D to 5-D tensors :func:`downsample` resizes."""
    shapes: list[str] = []

    def add(t: Tensor) -> None:
        if t.is_floating_point() and t.dim() in _MODES:
            shapes.append("(" + ", ".join(["N", *map(str, t.shape[1:])]) + ")")

    map_leaves(inputs, add)
    return ", ".join(shapes)


def scaled_forward(forward: Callable[[Any, Any], Any], model: Any, inputs: Any, scale_factor: float) -> Any:
    """``forward(model, downsample(inputs))``; an error of the model on a downsampled input is
    re-raised as a ``ValueError`` naming ``scale_factor``, the shapes before and after, and the fix.
    """
    small = downsample(inputs, scale_factor)
    try:
        return forward(model, small)
    except Exception as err:  # the model's own error on the resized input: say which knob to turn
        if scale_factor >= 1.0 or isinstance(err, torch.cuda.OutOfMemoryError):
            raise
        raise ValueError(
            f"the model failed on its selection input, downsampled by scale_factor={scale_factor} from "
            f"{_float_shapes(inputs)} to {_float_shapes(small)}: {type(err).__name__}: {err}. "
            f"A model that needs the full-size input (e.g. a Linear layer on flattened pixels) "
            "needs scale_factor=1"
        ) from err


def model_output(out: Any) -> Any:
    """The prediction tensor of a model output: ``out``, ``out.logits`` / ``out["logits"]``, or ``out[0]``.

    Example:
        >>> import torch
        >>> model_output({"logits": torch.ones(2), "loss": None}).tolist()
        [1.0, 1.0]
    """
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
    return model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
