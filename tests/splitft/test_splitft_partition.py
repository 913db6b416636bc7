"""harness/partition.py: the A | B | C stages compose to the model's own forward, to the bit."""
from __future__ import annotations

import pytest
import torch

from harness.errors import UserError
from harness.models import load_model, model_entry
from harness.partition import Partition


def _model(name: str):
    return load_model(model_entry(name)).model.eval()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-llama-tied"])
def test_stages_compose_to_the_models_forward(name):
    model = _model(name)
    ids = torch.randint(0, 200, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0   # left padding: the mask must reach every stage
    with torch.no_grad():
        assert torch.equal(Partition(model, 1, 2).forward(ids, mask), model(input_ids=ids, attention_mask=mask).logits)


def test_the_body_is_frozen_and_gradients_cross_both_cuts():
    model = _model("tiny-llama")
    part = Partition(model, 1, 2)
    part.freeze_body()
    assert not any(p.requires_grad for m in part.body_modules() for p in m.parameters())
    ids = torch.randint(0, 200, (2, 6), generator=torch.Generator().manual_seed(1))
    s_a, ctx = part.head(ids)
    s_a.retain_grad()
    s_b = part.body(s_a, ctx)
    s_b.retain_grad()
    part.tail(s_b, ctx).sum().backward()
    assert s_a.grad is not None and s_b.grad is not None and s_a.grad.abs().sum() > 0
    assert all(p.grad is None for m in part.body_modules() for p in m.parameters())
    assert part.model.get_input_embeddings().weight.grad is not None


@pytest.mark.parametrize("k, m", [(0, 1), (1, 1), (2, 1), (1, 3)])
def test_bad_cut_points(k, m):
    with pytest.raises(UserError, match="cut points must satisfy"):
        Partition(_model("tiny-llama"), k, m)
