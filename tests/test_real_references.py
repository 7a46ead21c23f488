"""The hand-fused bounds of the real-model samples compute the model's function from its weights."""

from __future__ import annotations

import pytest
import torch

from optimus_lens import sample_models
from optimus_lens.sample_models.recsys_real import FusedTwinTowers


@pytest.mark.parametrize("name", ["mmoe", "twin_towers"])
def test_hand_fused_reference_gives_the_models_values_and_strides(name):
    model, inputs = sample_models.get(name)
    ref = model.optimus_reference().eval()
    with torch.no_grad():
        want, got = model(*inputs), ref(*inputs)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def test_twin_towers_bound_with_the_per_tower_tail_matches_too_and_packs_copies_not_views():
    model, inputs = sample_models.get("twin_towers")
    ref = FusedTwinTowers(model, fuse_tail=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(ref(*inputs), model(*inputs))
        model.towers[0][0].weight.add_(1.0)  # the bound holds a copy made at construction
    assert not torch.equal(ref.w0[0], model.towers[0][0].weight.t())
