"""What a benchmark run records: one :class:`EpochRecord` per epoch, one :class:`RunResult` per run.

>>> r = RunResult("baseline", "baseline", 0, 100, [EpochRecord(0, 1.0, 1.0, 90.0, 0.3, 0.4, 1, 100, 100, 0, 100, 0.1)])
>>> r.final_acc, r.totals()["work_fraction"]
(90.0, 1.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["EpochRecord", "RunResult"]


@dataclass
class EpochRecord:
    """What happened in one epoch. Counts are samples; times are seconds since the run started."""

    epoch: int
    train_time: float  # cumulative training wall-clock (evaluation excluded)
    train_cpu_time: float  # cumulative CPU time of this process over the same spans (all threads)
    test_acc: float  # percent
    test_loss: float
    train_loss: float  # mean of the loss that was backpropagated
    steps: int
    loaded: int  # samples the epoch served (after pruning)
    forwarded: int  # samples in full-resolution training forward passes
    select_forwarded: int  # samples in selection passes (at sb_scale resolution)
    backpropagated: int
    lr: float  # learning rate of the last step
    threshold: float | None = None  # InfoBatch's pruning threshold (mean score) when planned
    pruning: bool | None = None
    dropped: int = 0  # served but not trained: a last batch of one sample, with BatchNorm in the model
    update_time: float = 0.0  # host seconds in InfoBatch.update this epoch (mean over ranks; pruning rows)
    gathered_bytes: int = 0  # bytes each rank's per-step score gathers returned this epoch (torchrun)


@dataclass
class RunResult:
    """One finished run: a method, a seed, its per-epoch curve and loss-histogram snapshots."""

    label: str
    kind: str
    seed: int
    num_train: int
    epochs: list[EpochRecord]
    histograms: list[dict[str, Any]] = field(default_factory=list)
    eval_time: float = 0.0
    sb_scale: float = 1.0
    load_avg: list[float] = field(default_factory=list)  # 1-minute load average at start and end
    budget: float = 1.0  # fraction of the baseline's steps this run trained for
    full_epochs: int | None = None  # the comparison's epochs (the baseline's work); None: len(epochs)
    batch: float = 1.0  # fraction of the batch size this run trained with (a batch-budget baseline)
    # Work done before the first epoch and charged to the run (RHO-LOSS's holdout model): time_s and
    # cpu_time_s (already inside the epochs' cumulative times), forwarded and backpropagated
    # samples, and cost, one such sample pass's FLOPs as a share of the main model's.
    setup: dict[str, float] | None = None
    gather_time: float = 0.0  # seconds of one step's score gather, ranks aligned (torchrun, pruning rows)
    overlap_time: float = 0.0  # seconds a step's score rows add to a training step, sent as trained
    gather_overlap_time: float = 0.0  # the same, sent by the plain all-gather instead (a comparison)
    carried_share: float = 0.0  # the share of this run's score rows that rode DDP's gradient all-reduce

    @property
    def final_acc(self) -> float:
        return self.epochs[-1].test_acc

    @property
    def train_time(self) -> float:
        return self.epochs[-1].train_time

    @property
    def train_cpu_time(self) -> float:
        return self.epochs[-1].train_cpu_time

    def totals(self) -> dict[str, float]:
        """Fractions of the baseline's work (epochs x training samples); a setup's samples count in the
        forward and backward fractions, and in the work at its cost per sample.

        Example:
            >>> e = EpochRecord(0, 1.0, 1.0, 90.0, 0.3, 0.4, 1, 100, 100, 0, 100, 0.1)
            >>> il = {"forwarded": 30.0, "backpropagated": 10.0, "cost": 0.1}
            >>> round(RunResult("rho-loss", "rho-loss", 0, 100, [e], setup=il).totals()["work_fraction"], 3)
            1.017
        """
        full = float((self.full_epochs or len(self.epochs)) * self.num_train)
        fwd = float(sum(e.forwarded for e in self.epochs))
        sel = sum(e.select_forwarded for e in self.epochs)
        bwd = float(sum(e.backpropagated for e in self.epochs))
        loaded = sum(e.loaded for e in self.epochs)
        # A backward pass costs about two forward passes; a selection pass at scale s costs s^2 of one.
        work = fwd + sel * self.sb_scale**2 + 2.0 * bwd
        if self.setup is not None:
            s_fwd, s_bwd = self.setup["forwarded"], self.setup["backpropagated"]
            work += (s_fwd + 2.0 * s_bwd) * self.setup["cost"]
            fwd, bwd = fwd + s_fwd, bwd + s_bwd
        return {
            "loaded_fraction": loaded / full,
            "forward_fraction": (fwd + sel) / full,
            "backward_fraction": bwd / full,
            "work_fraction": work / (3.0 * full),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.label,
            "kind": self.kind,
            "seed": self.seed,
            "budget": self.budget,
            "batch": self.batch,
            "setup": self.setup,
            "gather_time_s": self.gather_time,
            "overlap_time_s": self.overlap_time,
            "gather_overlap_time_s": self.gather_overlap_time,
            "carried_share": self.carried_share,
            "steps": sum(e.steps for e in self.epochs),
            "final_test_acc": self.final_acc,
            "train_time_s": self.train_time,
            "eval_time_s": self.eval_time,
            "train_cpu_time_s": self.epochs[-1].train_cpu_time,
            "load_avg_start_end": self.load_avg,
            **self.totals(),
            "epochs": [asdict(e) for e in self.epochs],
            "loss_histograms": self.histograms,
        }
