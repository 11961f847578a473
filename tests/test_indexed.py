"""One way for a batch to name its samples (``leanbatch.indexed``), for the plain loop, Lightning and
Hugging Face alike: one tagging rule, one set of checks and messages, each layout's round trip exact."""

from __future__ import annotations

from collections import OrderedDict, UserDict, namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from leanbatch import InfoBatch
from leanbatch.hf import INDEX_KEY, IndexedDataset
from leanbatch.hf.data import IndexCollator, Rows
from leanbatch.indexed import WithIndex, join_index, split_index, untag
from leanbatch.lightning import WithIndex as LightningWithIndex

Pair = namedtuple("Pair", "x y")


def test_the_adapters_tag_items_with_the_one_core_piece():
    assert LightningWithIndex is WithIndex and issubclass(IndexedDataset, WithIndex)
    ds = IndexedDataset([{"a": 1}])
    assert (ds.key, ds.flat) == (INDEX_KEY, False)


def test_flat_batches_carry_their_indices_through_a_loader_and_split_exactly():
    data = TensorDataset(torch.arange(10.0), torch.arange(10) % 3)
    order = [7, 2, 9, 0, 5, 1]
    batches = list(DataLoader(WithIndex(data), batch_size=4, sampler=order))
    idx = torch.cat([split_index(b, "index")[1] for b in batches])
    assert idx.tolist() == order and idx.dtype == torch.int64
    (x, y), i = split_index(batches[0], "index")
    assert x.tolist() == [7.0, 2.0, 9.0, 0.0] and torch.equal(i, x.long())
    rest, i = split_index(join_index({"x": x}, i, "k"), "k")
    assert list(rest) == ["x"] and i.tolist() == [7, 2, 9, 0]
    assert WithIndex(["v"])[0] == ("v", 0) and WithIndex([[1, 2]])[0] == (1, 2, 0)
    assert WithIndex([UserDict(a=1)])[0] == {"a": 1, "index": 0}  # any mapping: a plain dict


def test_kept_apart_items_come_back_exactly_as_the_dataset_returned_them():
    items = [Pair(1, 2), [3, 4], "text", OrderedDict(b=5), UserDict(c=6), {"d": 7}]
    ds = WithIndex(items, "i", flat=False)
    assert ds[5] == {"d": 7, "i": 5}  # a plain dict carries it as a column (survives column filters)
    back, indices = untag([ds[j] for j in (4, 0, 5, 2, 1, 3)], "i")
    assert indices == [4, 0, 5, 2, 1, 3]
    assert back == [items[j] for j in indices]
    assert [type(b) for b in back] == [type(items[j]) for j in indices]  # namedtuple, list, OrderedDict kept
    assert untag([Pair(1, 2), Pair(3, 4)], "i") is None  # an evaluation pass: nothing to untag
    assert untag([{"d": 1}], "i") is None and untag([], "i") is None


def test_the_hf_collator_attaches_the_rows_and_leaves_evaluation_batches_alone():
    seen = []

    def collate(items):
        seen.append(items)
        return {"labels": torch.tensor([it["labels"] for it in items])}

    ds = IndexedDataset([{"labels": [5, 6]}, {"labels": [-100, -100]}, {"labels": [4, 1]}])
    batch = IndexCollator(collate, shift=False)([ds[2], ds[1]])
    assert isinstance(batch[INDEX_KEY], Rows) and batch[INDEX_KEY].indices.tolist() == [2, 1]
    assert batch[INDEX_KEY].labelled.tolist() == [True, False]
    assert seen[-1] == [{"labels": [4, 1]}, {"labels": [-100, -100]}]  # the collator never sees the key
    plain = IndexCollator(collate, shift=False)([{"labels": [1, 2]}])
    assert INDEX_KEY not in plain


def test_an_item_that_already_holds_the_key_is_one_error_in_every_adapter():
    from leanbatch.lightning import LeanBatchCallback

    for ds, key in (
        (WithIndex([{"index": 1}]), "index"),
        (LeanBatchCallback(InfoBatch([{"idx": 1}], 2), index_key="idx").dataset, "idx"),
        (IndexedDataset([{INDEX_KEY: 1}]), INDEX_KEY),
    ):
        with pytest.raises(ValueError, match=rf"already have a '{key}' key.*pick another key"):
            ds[0]
    with pytest.raises(TypeError, match="key must be a non-empty str"):
        WithIndex([1], key="")
    with pytest.raises(KeyError, match=r"no 'index' key.*WithIndex\(dataset\)"):
        split_index({"x": torch.ones(1)}, "index")
    with pytest.raises(TypeError, match=r"does not end with its dataset indices.*got list"):
        split_index([torch.ones(2), 3], "index")
