"""Composer drop-in: what Composer's callers pass to ``select_using_loss`` works here too.

Composer's own tests rank a fake integer loss (``torch.ones_like(target)``), and its
Hugging Face models take the whole batch dict (``model(X)`` with ``X`` a dict). Both work;
what Composer would mis-handle is refused with an error naming the argument.
"""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from selection_helpers import cnn

from leanbatch import SelectiveBackprop, select_indices, select_using_loss, selection_losses

N = 16


def ones_like_loss(output: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return torch.ones_like(target)  # Composer's fake loss: an int64 tensor


def row_id_loss(output: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return target  # integer losses: row i has loss i


class DictModel(nn.Module):
    """Takes the batch dict, as Composer's HuggingFaceModel does, and returns an HF-like output."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 4)
        self.head = nn.Linear(4, N)  # one class per row id
        self.seen: list[set[str]] = []

    def forward(self, batch: dict) -> SimpleNamespace:
        self.seen.append(set(batch))
        h = (self.emb(batch["input_ids"]) * batch["attention_mask"].unsqueeze(-1)).mean(1)
        return SimpleNamespace(logits=self.head(h))


def dict_batch(n: int = N) -> tuple[dict, torch.Tensor]:
    ids = torch.arange(n)[:, None].repeat(1, 5) % 50  # row i holds token i: rows are recognisable
    X = {
        "input_ids": ids,
        "attention_mask": torch.ones(n, 5, dtype=torch.long),
        "pixel_scale": torch.tensor(2.0),  # 0-d: not per example, kept
        "task": "toy",  # not a tensor: kept
        "extra": [torch.arange(n) * 10],  # nested per-example tensor: cut too
    }
    return X, torch.arange(n)


def test_integer_losses_are_ranked_like_float_ones() -> None:
    X, y = torch.randn(N, 3), torch.arange(N)
    model = nn.Linear(3, 2)
    Xs, ys = select_using_loss(X, y, model, ones_like_loss, 0.5, 1)  # Composer's test, positionally
    assert Xs.shape == (N // 2, 3) and torch.equal(Xs, X[ys])
    # integer losses are ranked, not just accepted: the same draws as the same losses as floats
    for seed in range(20):
        as_int = select_using_loss(
            X, y, model, row_id_loss, 0.5, generator=torch.Generator().manual_seed(seed)
        )
        as_float = select_using_loss(
            X, y.float(), model, row_id_loss, 0.5, generator=torch.Generator().manual_seed(seed)
        )
        assert torch.equal(as_int[0], as_float[0])
    # and the rule favours large integer losses
    hits = torch.zeros(N)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        hits[select_using_loss(X, y, model, row_id_loss, 0.5, generator=g)[1]] += 1
    assert hits[12:].mean() > 2.5 * hits[:4].mean()
    ints, floats = torch.tensor([5, 1, 9, 3]), torch.tensor([5.0, 1.0, 9.0, 3.0])
    for seed in range(10):
        g_int, g_float = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(select_indices(ints, 0.5, g_int), select_indices(floats, 0.5, g_float))
    sb = SelectiveBackprop(keep=0.5, scale_factor=1.0, interrupt=0)
    out = sb.select((X, y), model, ones_like_loss, progress=0.6, batch_idx=0)
    assert out.losses is not None and out.losses.dtype == torch.float32 and out.batch[0].shape == (N // 2, 3)


def test_dict_input_goes_to_the_model_whole_and_every_per_example_tensor_is_cut() -> None:
    X, y = dict_batch()
    model = DictModel()
    g = torch.Generator().manual_seed(3)
    Xs, ys = select_using_loss(X, y, model, F.cross_entropy, keep=0.25, generator=g)
    assert model.seen == [set(X)]  # one forward, on the whole dict (model(X), as Composer calls it)
    assert type(Xs) is dict and set(Xs) == set(X) and len(ys) == 4
    assert torch.equal(Xs["input_ids"][:, 0], ys)  # rows stay with their targets
    assert Xs["attention_mask"].shape == (4, 5) and torch.equal(Xs["extra"][0], ys * 10)
    assert Xs["task"] == "toy" and Xs["pixel_scale"] is X["pixel_scale"]
    assert torch.equal(ys, ys.sort().values)  # batch order kept
    # the same losses as the model's own per-example cross-entropy, chunked or not
    want = F.cross_entropy(model(X).logits, y, reduction="none")
    assert torch.allclose(selection_losses(X, y, model, F.cross_entropy), want, atol=1e-6)
    assert torch.allclose(selection_losses(X, y, model, F.cross_entropy, chunk_size=5), want, atol=1e-6)
    # a mapping type other than dict comes back as that type
    Xo, _ = select_using_loss(OrderedDict(X), y, model, F.cross_entropy, keep=0.5)
    assert isinstance(Xo, OrderedDict)


def test_dict_input_errors_name_the_argument() -> None:
    X, y = dict_batch()
    model = DictModel()
    with pytest.raises(ValueError, match=r"scale_factor=0.5 < 1 downsamples X.*scale_factor=1"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
    with pytest.raises(ValueError, match=r"X\['attention_mask'\] has 3 rows"):
        select_using_loss({**X, "attention_mask": torch.ones(3, 5)}, y, model, F.cross_entropy, keep=0.5)
    with pytest.raises(ValueError, match=r"X\['extra'\]\[0\] has 4 rows"):
        select_using_loss({**X, "extra": [torch.zeros(4)]}, y, model, F.cross_entropy, keep=0.5)
    with pytest.raises(ValueError, match="no tensor with a batch dimension"):
        select_using_loss({"task": "toy"}, y, model, F.cross_entropy, keep=0.5)
    texts = [f"example {i}" for i in range(len(y))]  # per-example, but not a tensor: cannot be cut
    with pytest.raises(ValueError, match=r"X\['texts'\] is a 16-item list.*make it a tensor"):
        select_using_loss({**X, "texts": texts}, y, model, F.cross_entropy, keep=0.5)
    with pytest.raises(TypeError, match=r"y must be a torch.Tensor"):
        select_using_loss(X, [0, 1], model, F.cross_entropy, keep=0.5)

    class KeywordModel(nn.Module):  # a bare Hugging Face model: keyword inputs only
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return input_ids.float()

    with pytest.raises(TypeError, match=r"hf_model\(\*\*X\)"):
        select_using_loss(X, y, KeywordModel(), F.cross_entropy, keep=0.5)


def test_what_composer_mis_handles_is_still_refused() -> None:
    X, y = torch.randn(N, 3), torch.arange(N)
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match=r"loss_fun must return real per-example losses.*torch.bool"):
        select_using_loss(X, y, model, lambda o, t, reduction="none": t > 3, keep=0.5)
    with pytest.raises(TypeError, match=r"loss_fun .*complex"):
        select_using_loss(X, y, model, lambda o, t, reduction="none": t * 1j, keep=0.5)
    with pytest.raises(TypeError, match="losses must return real"):
        select_indices(torch.tensor([True, False]), 0.5)
    with pytest.raises(TypeError, match="X must be a torch.Tensor batch of inputs or a dict"):
        select_using_loss([X], y, model, ones_like_loss, keep=0.5)  # Composer would index a list
    with pytest.raises(ValueError, match="one loss per example"):
        select_using_loss(X, y, model, lambda o, t, reduction="none": t.sum(), keep=0.5)


def test_select_using_loss_keeps_rows_aligned_and_favours_high_loss() -> None:
    torch.manual_seed(0)
    n = 64
    X = torch.randn(n, 1, 8, 8)
    y = torch.arange(n)  # row id as the target
    # a "model" whose output encodes the row's id; the loss is larger for larger ids
    model = lambda x: x.flatten(1)[:, :1]  # noqa: E731
    row_id = X.flatten(1)[:, :1]

    def loss_fun(out: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        assert reduction == "none"
        return target.float() + 0 * out[:, 0]

    hits = torch.zeros(n)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        X_new, y_new = select_using_loss(
            X, y, model, loss_fun, 0.5, 1, generator=g
        )  # Composer's positional form
        assert X_new.shape == (32, 1, 8, 8) and y_new.shape == (32,)
        assert torch.equal(X_new.flatten(1)[:, :1], row_id[y_new])  # X and y rows still belong together
        hits[y_new] += 1
    assert hits[48:].mean() > 2.5 * hits[:16].mean()


def test_select_using_loss_bad_inputs() -> None:
    model = cnn().eval()
    X, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    flat = torch.randn(8, 64)
    lin = nn.Linear(64, 10)
    with pytest.raises(ValueError, match="keep"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0)
    with pytest.raises(ValueError, match="scale_factor"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0.5, scale_factor=1.5)
    with pytest.raises(ValueError, match="scale_factor"):  # 2-D input cannot be downsampled
        select_using_loss(flat, y, lin, F.cross_entropy, keep=0.5, scale_factor=0.5)
    with pytest.raises(ValueError, match="scale_factor"):  # integer images neither
        select_using_loss(X.long(), y, model, F.cross_entropy, keep=0.5, scale_factor=0.5)
    with pytest.raises(TypeError, match="reduction"):
        select_using_loss(X, y, model, lambda out, target: F.cross_entropy(out, target), keep=0.5)
    with pytest.raises(ValueError, match="one loss per example"):  # ignores reduction: a scalar
        select_using_loss(
            X, y, model, lambda out, target, reduction="mean": F.cross_entropy(out, target), 0.5
        )
    with pytest.raises(ValueError, match="per_sequence_loss"):
        select_using_loss(X, y, model, lambda o, t, reduction="none": o, keep=0.5)
    with pytest.raises(ValueError, match="y must"):
        select_using_loss(X, y[:5], model, F.cross_entropy, keep=0.5)
    with pytest.raises(TypeError, match="X must"):
        select_using_loss([1, 2], y, model, F.cross_entropy, keep=0.5)
    with pytest.raises(TypeError, match="generator"):
        select_using_loss(X, y, model, F.cross_entropy, keep=0.5, generator=0)
    with pytest.raises(ValueError, match="losses"):
        select_indices(torch.ones(3, 2), 0.5)
    # a loss module is adapted, not rejected
    assert select_using_loss(X, y, model, nn.CrossEntropyLoss(), keep=0.5)[0].shape[0] == 4
