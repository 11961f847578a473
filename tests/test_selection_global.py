"""Global selection (``scope="global"``) under real torch.distributed processes (gloo on CPU): the
ranks rank the whole step's rows together, every rank arrives at the one choice a single process
makes over the concatenated batch, keeps its own rows of it, and a DDP step trains exactly the
chosen rows, a rank left without any included. Processes that outlive the deadline fail the test."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from ranks import in_process_group, spawn_ranks
from selection_helpers import READS
from test_selection_oracles import exact_inclusion

from leanbatch import OnlineBatchSelection, SelectiveBackprop, select_by_loss_rank, select_indices
from leanbatch.rng import Generators
from leanbatch.selection import HistoryRule, TopRule, UniformRule
from leanbatch.selection.rules import Draw

WORLD, N, SEED, STEPS, DEADLINE = 2, 8, 11, 12, 240.0
UNIFORM_KEEP = 0.1  # of 16 rows: keeps one, so one rank is left empty at every step
FREQ_STEPS, FREQ_LOSSES = 2000, ([0.3, 0.1, 0.7, 0.5], [0.2, 0.8, 0.4, 0.6])  # 4 rows a rank


def spawn(worker: Callable[..., None], deadline: float = DEADLINE) -> list[Any]:
    """Run ``worker(rank, out_dir)`` in a process group of WORLD processes; what each saved; fail on a hang."""
    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(in_process_group, (WORLD, os.path.join(tmp, "init"), worker, tmp), WORLD, deadline)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(WORLD)]


def loss_of_value(out: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return out[:, 0]  # the input is the loss


def values(rank: int, t: int) -> torch.Tensor:
    """Rank ``rank``'s scores at step ``t``: rank 1's are harder on average, so the counts vary, and
    every third step all of rank 0's are easier than all of rank 1's (top-k leaves rank 0 empty)."""
    v = torch.rand(N, generator=torch.Generator().manual_seed(1000 * t + rank)) + 0.4 * rank
    return v * 0.01 if rank == 0 and t % 3 == 2 else v


def selectors(scope: str = "global") -> dict[str, Any]:
    common: dict[str, Any] = dict(start=0.0, end=1.0, interrupt=0, seed=SEED, scope=scope)
    forward = dict(common, keep=0.5, scale_factor=1.0, loss_fn=loss_of_value)
    return {
        "rank": SelectiveBackprop(**forward),
        "top": SelectiveBackprop(**forward, rule="top"),
        "history": SelectiveBackprop(**forward, rule="history", beta=1.0, history_size=64),
        "uniform": SelectiveBackprop(**common, keep=UNIFORM_KEEP, rule="uniform"),  # one row: a rank is empty
        "loss_rank": OnlineBatchSelection(WORLD * N, keep=0.5, pressure=100.0, **common),
    }


def count_host_reads(run: Callable[[], None]) -> int:
    """How many Python reads of a tensor value ``run`` makes (``.tolist()``, ``.item()``, ...)."""
    calls = [0]
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return original(*args, **kwargs)

        return wrapper

    for name, fn in saved.items():
        setattr(torch.Tensor, name, counting(fn))
    try:
        run()
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
    return calls[0]


def _steps(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: {"positions": [], "filled": []} for name in selectors()}
    sels = selectors()
    y, idx = torch.arange(N), torch.arange(N) + rank * N
    for t in range(STEPS):
        x = values(rank, t).view(N, 1)
        for name, sel in sels.items():
            before = sel.stats.filled
            if name == "loss_rank":
                sel.record_losses(idx, x[:, 0])
                got = sel.select((x, y), progress=0.5, batch_idx=t, indices=idx)
            else:
                got = sel.select((x, y), nn.Identity(), progress=0.5, batch_idx=t)
            out[name]["positions"].append(got.positions)
            out[name]["filled"].append(sel.stats.filled - before)
    return out


def _frequencies(rank: int) -> torch.Tensor:
    sb = SelectiveBackprop(0.0, 1.0, 0.5, 1.0, 0, loss_fn=loss_of_value, seed=SEED, scope="global")
    x, counts = torch.tensor(FREQ_LOSSES[rank]).view(4, 1), torch.zeros(4)
    for t in range(FREQ_STEPS):
        filled = sb.stats.filled
        got = sb.select((x, torch.arange(4)), nn.Identity(), progress=0.5, batch_idx=t)
        assert got.positions is not None
        if sb.stats.filled == filled:  # not a filler row: chosen
            counts.index_add_(0, got.positions, torch.ones(got.positions.shape[0]))
    return counts


def _reads(rank: int) -> dict[str, list[int]]:
    x, y = values(rank, 0).view(N, 1), torch.arange(N)
    out = {}
    for scope in ("global", "local"):
        sb = SelectiveBackprop(0.0, 1.0, 0.5, 1.0, 0, loss_fn=loss_of_value, seed=SEED, scope=scope)
        sb.select((x, y), nn.Identity(), progress=0.5, batch_idx=0)  # the first: checks the batch sizes
        out[scope] = [
            count_host_reads(lambda t=t, sb=sb: sb.select((x, y), nn.Identity(), progress=0.5, batch_idx=t))
            for t in range(1, 6)
        ]
    return out


def _iterate(rank: int) -> dict[str, Any]:
    sb = SelectiveBackprop(0.0, 1.0, scale_factor=1.0, interrupt=0, rule="history", beta=50.0,
                           history_size=64, loss_fn=loss_of_value, seed=SEED, scope="global")  # fmt: skip
    tiny = values(rank, 1) * 1e-3  # below everything remembered: cdf ** 50 keeps nobody of step 1
    loader = [(v.view(N, 1), torch.arange(N)) for v in (values(rank, 0) + 10, tiny, values(rank, 2) + 20)]
    sizes = [int(y.shape[0]) for _, y in sb.iterate(loader, nn.Identity(), epoch=0, num_epochs=1)]
    try:
        list(sb.iterate(loader, nn.Identity(), epoch=0, num_epochs=1, batch_size=N))
        refused = ""
    except ValueError as e:
        refused = str(e)
    return {"sizes": sizes, "filled": sb.stats.filled, "refused": refused}


def _selection_worker(rank: int, out_dir: str) -> None:
    out = {"steps": _steps(rank), "freq": _frequencies(rank), "reads": _reads(rank)}
    out["iterate"] = _iterate(rank)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def runs() -> list[Any]:
    return spawn(_selection_worker)


def reference(name: str, t: int, scores: torch.Tensor, history: HistoryRule) -> torch.Tensor:
    """The choice one process makes over the concatenated batch with the shared generator of draw t."""
    gen = Generators(SEED).shared("cpu", t)
    if name == "rank":
        return select_indices(scores, 0.5, gen)
    if name == "top":
        return TopRule(0.5).positions(scores, Draw(WORLD * N, scores.device))
    if name == "uniform":
        return UniformRule(UNIFORM_KEEP).positions(None, Draw(WORLD * N, torch.device("cpu"), gen))
    if name == "loss_rank":
        return select_by_loss_rank(scores, 0.5, 100.0, gen)
    return history.positions(scores, Draw(WORLD * N, scores.device, gen, 0.5, True))


def test_every_rank_keeps_its_rows_of_the_one_choice_over_the_whole_step(runs: list[Any]) -> None:
    fillers = dict.fromkeys(selectors(), 0)
    for name in selectors():
        history = HistoryRule(64, 1.0)  # the replay's own buffer, fed the concatenated batches
        mine = [0, 0]
        for t in range(STEPS):
            scores = torch.cat([values(r, t) for r in range(WORLD)])
            chosen = []
            for r, run in enumerate(runs):
                pos, filled = run["steps"][name]["positions"][t], run["steps"][name]["filled"][t]
                if filled:  # a rank the choice left empty trains one row, counted as filled
                    fillers[name] += 1
                    hardest = 0 if name == "uniform" else int(values(r, t).argmax())  # uniform: no scores
                    assert filled == 1 and pos.tolist() == [hardest], (name, t)
                else:
                    chosen.append(pos + r * N)
                    mine[r] += int(pos.shape[0])
            union = torch.cat(chosen)
            assert torch.equal(union, reference(name, t, scores, history)), (name, t)
        assert mine[0] != mine[1], (name, mine)  # the counts follow the scores, not the ranks
    assert fillers["uniform"] == STEPS and fillers["top"] >= STEPS // 3, fillers


def test_inclusion_frequencies_follow_the_rank_rule_over_the_global_batch(runs: list[Any]) -> None:
    freq = torch.cat([run["freq"] for run in runs]) / FREQ_STEPS  # global position -> frequency
    by_rank = freq[torch.argsort(torch.tensor(FREQ_LOSSES).flatten())]  # ascending loss rank
    expected = torch.tensor(exact_inclusion(WORLD * 4, 0.5))
    sd = (expected * (1 - expected) / FREQ_STEPS).sqrt()
    assert ((by_rank - expected).abs() / sd).max() < 4.5, (by_rank, expected)
    # power: each rank keeping 2 of its own 4 by their local ranks would differ clearly
    local = torch.tensor(exact_inclusion(4, 0.5))
    local_freq = torch.cat([local[torch.argsort(torch.argsort(torch.tensor(v)))] for v in FREQ_LOSSES])
    local_by_rank = local_freq[torch.argsort(torch.tensor(FREQ_LOSSES).flatten())]
    assert ((local_by_rank - expected).abs() / sd).max() > 10


def test_a_global_step_reads_the_device_once_and_a_local_one_never(runs: list[Any]) -> None:
    for run in runs:
        assert run["reads"] == {"global": [1] * 5, "local": [0] * 5}


def test_iterate_yields_each_selection_and_skips_on_every_rank_together(runs: list[Any]) -> None:
    a, b = (run["iterate"] for run in runs)
    assert len(a["sizes"]) == len(b["sizes"]) == 2  # step 1: nobody on any rank, skipped by both
    assert "drop batch_size" in a["refused"] and "drop batch_size" in b["refused"]
    kept = a["sizes"][0] + b["sizes"][0] - (a["filled"] > 0) - (b["filled"] > 0)
    assert kept > 0 and a["sizes"] != [N, N]  # each step's own selection, not accumulated batches


# ------------------------------------------------- a rank the choice leaves empty, under DDP
EASY = torch.tensor([[0.0, 0.1, 0.2, 0.3], [1.0, 1.1, 1.2, 1.3]])  # step 0: rank 0 holds no top-4 row
MIXED = torch.tensor([[2.0, 0.1, 0.2, 0.3], [1.0, 1.1, 1.2, 0.0]])  # step 1: rank 0 holds one, rank 1 three


def ddp_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    hardness = (EASY, MIXED)[step][rank]
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 * step + rank))
    x[:, 0] = hardness  # the scorer reads column 0
    return x, torch.randn(4, generator=torch.Generator().manual_seed(100 + 10 * step + rank))


def hardness_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x[:, 0]


def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 1)


def _ddp_worker(rank: int, out_dir: str) -> None:
    model = nn.parallel.DistributedDataParallel(linear())
    sb = SelectiveBackprop(0.0, 1.0, 0.5, 1.0, 0, rule="top", scorer=hardness_of, seed=SEED, scope="global")
    steps = []
    for step in range(2):
        sel = sb.select(ddp_batch(rank, step), model.module, progress=0.5, batch_idx=step)
        x, y = sel.batch
        loss = sb.step_loss((model(x).squeeze(1) - y) ** 2)  # DDP's backward runs on every rank
        model.zero_grad()
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        steps.append({"positions": sel.positions, "loss": loss.detach(), "grads": grads})
    uneven = SelectiveBackprop(0.0, 1.0, 0.5, 1.0, 0, scorer=hardness_of, seed=SEED, scope="global")
    x, y = ddp_batch(rank, 0)
    try:  # rank 1 passes one row fewer: refused on both ranks at the first draw
        uneven.select((x[: 4 - rank], y[: 4 - rank]), progress=0.5, batch_idx=0)
        error = ""
    except ValueError as e:
        error = str(e)
    out = {"steps": steps, "stats": sb.stats.as_dict(), "error": error}
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def test_an_empty_rank_trains_its_hardest_row_with_weight_zero_and_ddp_trains_the_chosen_rows() -> None:
    a, b = spawn(_ddp_worker)
    # step 0: the top 4 are all rank 1's; rank 0 trains its hardest row (3) with weight 0
    assert a["steps"][0]["positions"].tolist() == [3] and float(a["steps"][0]["loss"]) == 0.0
    assert b["steps"][0]["positions"].tolist() == [0, 1, 2, 3]
    assert a["steps"][1]["positions"].tolist() == [0] and b["steps"][1]["positions"].tolist() == [0, 1, 2]
    assert a["stats"]["filled"] == 1 and b["stats"]["filled"] == 0
    assert a["stats"]["backpropagated"] == 2 and a["stats"]["skipped"] == 6  # the filler was computed
    assert b["stats"]["backpropagated"] == 7 and b["stats"]["skipped"] == 1
    for step, rows in enumerate(([[], [0, 1, 2, 3]], [[0], [0, 1, 2]])):
        # the gradient DDP leaves on every rank is the mean over the chosen rows of the whole step
        x = torch.cat([ddp_batch(r, step)[0][rows[r]] for r in range(WORLD)])
        y = torch.cat([ddp_batch(r, step)[1][rows[r]] for r in range(WORLD)])
        model = linear()
        ((model(x).squeeze(1) - y) ** 2).mean().backward()
        for run in (a, b):
            for got, want in zip(run["steps"][step]["grads"], model.parameters(), strict=True):
                assert torch.allclose(got, want.grad, atol=1e-6), (step, got, want.grad)
    assert "[4, 3]" in a["error"] and "[4, 3]" in b["error"]


# ------------------------------------------------------------- without a process group
def test_global_scope_without_a_process_group_draws_as_local_bit_for_bit() -> None:
    for (name, sel), local in zip(selectors().items(), selectors("local").values(), strict=True):
        y, idx = torch.arange(N), torch.arange(N)
        for t in range(5):
            x = values(0, t).view(N, 1)
            got = []
            for s in (sel, local):
                if name == "loss_rank":
                    s.record_losses(idx, x[:, 0])
                    got.append(s.select((x, y), progress=0.5, batch_idx=t, indices=idx).positions)
                else:
                    got.append(s.select((x, y), nn.Identity(), progress=0.5, batch_idx=t).positions)
            assert torch.equal(got[0], got[1]), (name, t)
            assert float(sel.step_loss(torch.tensor([1.0, 3.0]))) == 2.0  # the plain mean
        assert sel.scope == "global" and sel.stats == local.stats
