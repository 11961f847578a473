"""A cheaper scorer for batch-level selection: a small proxy model trained alongside the main one.

The CIFAR-10 speed records of the airbench family score each (large) batch with a much smaller
network of the same kind, trained on the batches it scores, and train the main model on the
proxy's hardest share. The main model is never run for selection. :class:`ProxyScorer` is what
``SelectiveBackprop(scorer=...)`` calls: ``scorer(inputs, target) -> (N,) losses``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from leanbatch.checks import check_bool, check_fraction, check_int, require
from leanbatch.selection.layout import batch_size
from leanbatch.selection.rules import Draw, TopRule
from leanbatch.selection.scoring import (
    PerExampleLoss,
    as_per_example_loss,
    check_losses,
    default_forward,
    model_output,
)

__all__ = ["ProxyScorer"]


class ProxyScorer:
    """Per-example losses from a small proxy model, which takes one training step on each batch it scores.

    Args:
        model: the proxy (e.g. the main architecture at a quarter of the width).
        optimizer: the proxy's own optimiser (its learning-rate schedule is the caller's).
        loss_fn: ``loss_fn(output, target, reduction="none")`` or a loss module.
        train: train the proxy on the batches it scores (default); ``False`` scores with
            the frozen proxy under ``no_grad``.
        train_every: take a training step on every ``train_every``-th scored batch only
            (default 1; airbench96 steps on one batch in 4 of a 45-epoch run, which starves
            the proxy of steps on short schedules); the others are scored under ``no_grad``
            (in train mode, as the proxy trains).
        train_keep: train the proxy on the hardest ``train_keep`` share of each batch it
            steps on (default 0.5, as airbench96: its own hardest half; 1 = every row). Then
            what the proxy finds easy is easy indeed, not merely what it has seen most: with
            every row (1.0) the main model, which rarely trains on the proxy's easy examples,
            learned markedly worse in short runs on MNIST digits.
        forward_fn: ``forward_fn(model, inputs) -> output`` when calling the model needs
            more than ``model(inputs)`` / ``model(**inputs)``.

    The returned losses are those of the forward pass before the step, detached, float32,
    on the inputs' device. Nothing is read back to the host.

    Example:
        >>> import torch, torch.nn.functional as F
        >>> proxy = torch.nn.Linear(4, 3)
        >>> scorer = ProxyScorer(proxy, torch.optim.SGD(proxy.parameters(), lr=0.1), F.cross_entropy)
        >>> x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        >>> before = proxy.weight.detach().clone()
        >>> losses = scorer(x, y)
        >>> losses.shape, losses.requires_grad, bool((proxy.weight != before).any()), scorer.steps
        (torch.Size([8]), False, True, 1)
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[..., Tensor],
        *,
        train: bool = True,
        train_every: int = 1,
        train_keep: float = 0.5,
        forward_fn: Callable[[Any, Any], Any] | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module (the proxy), got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer over the proxy's parameters, got {optimizer!r}"
            )
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable as forward_fn(model, inputs), got {forward_fn!r}")
        self.model = model
        self.optimizer = optimizer
        self._loss: PerExampleLoss = as_per_example_loss(loss_fn, "loss_fn")
        self.train = check_bool(train, "train")
        self.train_every = check_int(train_every, "train_every", 1)
        self.train_keep = check_fraction(train_keep, "train_keep")
        self._hardest = TopRule(self.train_keep)  # the proxy's own hardest share
        self.forward_fn = forward_fn or default_forward
        self.steps = 0  # training steps taken
        self.calls = 0  # batches scored

    def __call__(self, inputs: Any, target: Any) -> Tensor:
        n = batch_size(inputs, target)
        step = self.train and self.calls % self.train_every == 0
        self.calls += 1
        if self.train:
            self.model.train()
        with torch.set_grad_enabled(step):
            losses = check_losses(self._loss(model_output(self.forward_fn(self.model, inputs)), target), n)
            if step:
                trained = losses
                if self.train_keep < 1.0:  # the proxy's own hardest share (k is known on the host)
                    trained = losses.index_select(
                        0, self._hardest.positions(losses.detach(), Draw(n, losses.device))
                    )
                self.optimizer.zero_grad(set_to_none=True)
                trained.mean().backward()
                self.optimizer.step()
                self.steps += 1
        return losses.detach()

    def state_dict(self) -> dict[str, Any]:
        """The proxy's weights, its optimiser state and the step count (``weights_only``-loadable).

        Example:
            >>> import torch, torch.nn.functional as F
            >>> p = torch.nn.Linear(2, 2)
            >>> sorted(ProxyScorer(p, torch.optim.SGD(p.parameters(), lr=0.1), F.cross_entropy).state_dict())
            ['calls', 'model', 'optimizer', 'steps']
        """
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "calls": self.calls,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        require(state, ("model", "optimizer", "steps", "calls"), "ProxyScorer state_dict")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps, self.calls = int(state["steps"]), int(state["calls"])
