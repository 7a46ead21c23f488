"""Small helpers shared by the sample-model modules."""

from __future__ import annotations

import contextlib

import torch

SEED = 0


@contextlib.contextmanager
def seeded(seed: int = SEED):
    """Run the body with ``torch.manual_seed(seed)`` on a forked CPU RNG.

    Builds are deterministic, and the caller's global RNG state is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
