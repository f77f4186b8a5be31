"""Reranker training pieces: the listwise + pointwise group loss and the hard-negative groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slb.reranker import RerankerTrainConfig, build_groups, group_loss
from slb.tools import as_entry, tool_text

from .conftest import QUERIES, TOOLS


def test_group_loss_is_softmax_cross_entropy_with_the_gold_first_plus_weighted_bce():
    logits = torch.tensor([2.0, 0.0, -1.0, 1.0, 3.0])  # two groups: [2, 0, -1] and [1, 3]
    lw = group_loss(logits, [3, 2], RerankerTrainConfig(listwise=1.0, pointwise=0.0))
    ce = (-(2 - math.log(math.exp(2) + 1 + math.exp(-1))) - (1 - math.log(math.exp(1) + math.exp(3)))) / 2
    assert float(lw) == pytest.approx(ce, rel=1e-5)
    pw = group_loss(logits, [3, 2], RerankerTrainConfig(listwise=0.0, pointwise=1.0))
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731  softplus: BCE of label 0 is sp(x), of label 1 is sp(-x)
    assert float(pw) == pytest.approx((sp(-2) + sp(0) + sp(-1) + sp(-1) + sp(3)) / 5, rel=1e-5)
    both = group_loss(logits, [3, 2], RerankerTrainConfig(listwise=1.0, pointwise=0.5))
    assert float(both) == pytest.approx(ce + 0.5 * float(pw), rel=1e-5)


def test_group_loss_gradient_raises_the_gold_and_lowers_the_hardest_negative():
    logits = torch.tensor([0.0, 1.0, 0.5], requires_grad=True)
    group_loss(logits, [3], RerankerTrainConfig()).backward()
    g = logits.grad
    assert g[0] < 0 and g[1] > g[2] > 0  # descent raises the gold, lowers the best-scoring negative most


def test_groups_put_the_gold_first_and_take_hard_negatives_from_the_scan(embedder):
    tools = [as_entry(t) for t in TOOLS]
    text = {t.name: tool_text(t) for t in tools}
    cfg = RerankerTrainConfig(queries_per_tool=2, negatives=4, labelled_repeats=2)
    groups = build_groups(tools, embedder, QUERIES, cfg)
    assert len(groups) == 2 * len(tools) + 2 * len(QUERIES)
    for q, texts in groups:
        assert len(texts) == len(set(texts)) == 5
    texts = dict(groups)["Will it rain in Paris today?"]
    assert texts[0] == text["get_weather"]
    cos = embedder.embed_tools(tools) @ embedder.embed_query("Will it rain in Paris today?")
    nearest = [text[tools[i].name] for i in np.argsort(-cos) if tools[i].name != "get_weather"]
    assert texts[1:4] == nearest[:3]  # the scan's nearest non-gold tools, best first, then one random tool
    assert texts[4] in nearest[3:]
    with pytest.raises(ValueError, match="loss weights"):
        RerankerTrainConfig(listwise=0.0, pointwise=0.0)
