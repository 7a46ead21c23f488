"""Swish -> SiLU, written as two plain functions.

Both are traced by torch.fx: ``pattern`` is what to find, ``replacement`` what to put in
its place; their inputs correspond by position. The pattern is named after this file.
"""

import torch
import torch.nn.functional as F


def pattern(x):
    """x * sigmoid(x) is SiLU."""
    return x * torch.sigmoid(x)


def replacement(x):
    return F.silu(x)
