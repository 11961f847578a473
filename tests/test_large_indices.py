"""An index above 2**24 (where float32 stops holding every integer) survives every path."""

from __future__ import annotations

import io

import torch

from leanbatch import InfoBatch

BIG = 2**24 + 100


def test_indices_above_two_to_the_24_survive_scores_plans_serving_and_state():
    ds = InfoBatch(range(BIG), 3, prune_ratio=0.5, delta=1.0, seed=0)
    it = iter(ds.sampler)
    served = torch.tensor([next(it) for _ in range(8)])
    high = torch.tensor([2**24 + 1, 2**24 + 3, 2**24 + 57, BIG - 1], dtype=torch.int64)
    losses = torch.tensor([0.25, 0.5, 0.75, 1.0])
    ds.update(torch.zeros(8), served)  # the served batch, trained
    ds.scores.update(torch.arange(BIG - 50, BIG), torch.full((50,), 9.0))
    ds.scores.update(high, losses)  # neighbours a float32 index would merge
    assert ds.scores.get(high).tolist() == losses.tolist()
    assert torch.isnan(ds.scores.get(high[:2] + 1)).all()  # 2**24 + 2 and 2**24 + 4: untouched
    buf = io.BytesIO()
    torch.save(ds.state_dict(), buf)
    buf.seek(0)
    again = InfoBatch(range(BIG), 3, prune_ratio=0.5, delta=1.0, seed=0)
    again.load_state_dict(torch.load(buf, weights_only=True))
    assert again.scores.get(high).tolist() == losses.tolist()
    # the next epoch's plan: the high, low-loss samples are candidates; those kept carry weight 2
    again.scores.update(torch.arange(BIG), torch.full((BIG,), 5.0))  # every sample scored, mean ~5
    again.scores.update(high, losses)
    again.set_epoch(1)
    plan = again.sampler.plan()
    kept_high = [int(i) for i in high if plan.kept is None or bool((plan.kept == i).any())]
    assert all(float(plan.weights[i]) == 2.0 for i in kept_high)
    assert plan.kept is not None and int(plan.kept.max()) >= 2**24  # kept indices past 2**24, exact
