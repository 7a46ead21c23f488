"""Realistic models: tiny, randomly initialised HuggingFace BERT and GPT-2.

``transformers`` is imported lazily inside the build functions, so this
package imports without it; nothing is ever downloaded (configs are built in
code and ``HF_HUB_OFFLINE=1`` is set before the import).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ._registry import register
from ._util import seeded

VOCAB = 1000
MAX_POSITIONS = 64
BATCH = 2
SEQ_LEN = 16


def _import_transformers():
    """Import ``transformers`` offline, or raise a clear ``ImportError``."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "the realistic sample models (bert, gpt2) need the `transformers` package; "
            "install it with `pip install -e .[models]`"
        ) from e
    return transformers


def _token_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids (2, 16)`` int64 in ``[0, 1000)`` and ``attention_mask (2, 16)`` int64 ones."""
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), dtype=torch.int64)
    attention_mask = torch.ones(BATCH, SEQ_LEN, dtype=torch.int64)
    return input_ids, attention_mask


class LastHiddenState(nn.Module):
    """Wrap a HuggingFace base model so ``forward`` returns a plain tensor.

    Inputs ``input_ids (B, T)`` int64 and ``attention_mask (B, T)`` int64 ->
    output ``last_hidden_state (B, T, hidden)`` float32.
    """

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.model = hf_model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@register(
    name="bert",
    description="Tiny random HF BertModel (hidden 64, 2 layers, 4 heads): q/k/v Linears share one input per layer",
    teaches=("batch_linear_lhs",),
    kind="realistic",
)
def build_bert():
    """Build a tiny random ``transformers.BertModel`` wrapped in :class:`LastHiddenState`.

    Config: hidden 64, 2 layers, 4 heads, intermediate 128, vocab 1000, max
    positions 64, eager attention, no pooler. Inputs ``input_ids (2, 16)`` int64,
    ``attention_mask (2, 16)`` int64 ones -> output ``(2, 16, 64)`` float32.
    """
    transformers = _import_transformers()
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS,
    )
    config._attn_implementation = "eager"
    with seeded():
        hf = transformers.BertModel(config, add_pooling_layer=False)
        model = LastHiddenState(hf).eval()
        inputs = _token_inputs()
    return model, inputs


@register(
    name="gpt2",
    description="Tiny random HF GPT2Model (n_embd 64, 2 layers, 4 heads): Conv1D = addmm, no Linear nodes",
    teaches=(),
    kind="realistic",
)
def build_gpt2():
    """Build a tiny random ``transformers.GPT2Model`` wrapped in :class:`LastHiddenState`.

    Config: n_embd 64, 2 layers, 4 heads, vocab 1000, n_positions 64, eager
    attention. Its projections are HF ``Conv1D`` (``torch.addmm``), so the graph
    has no ``linear`` nodes. Inputs ``input_ids (2, 16)`` int64,
    ``attention_mask (2, 16)`` int64 ones -> output ``(2, 16, 64)`` float32.
    """
    transformers = _import_transformers()
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=MAX_POSITIONS,
        bos_token_id=VOCAB - 1,  # the default 50256 lies outside the tiny vocabulary
        eos_token_id=VOCAB - 1,
    )
    config._attn_implementation = "eager"
    with seeded():
        hf = transformers.GPT2Model(config)
        model = LastHiddenState(hf).eval()
        inputs = _token_inputs()
    return model, inputs
