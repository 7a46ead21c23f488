"""HuggingFace ``transformers`` architectures as model specs, built offline with random weights.

    hf:bert                          a small BertModel: 2 layers, hidden 64, 4 heads
    hf:llama?layers=12&hidden=768    the same architecture at full size

The model is built from a configuration alone (``AutoConfig.for_model`` +
``AutoModel.from_config``): nothing is downloaded, no weights are read, and
``HF_HUB_OFFLINE`` is set before ``transformers`` is imported. Weights are random with
a fixed seed (``torch.manual_seed(0)`` on a forked RNG), so two builds of one spec give
the same graph and the same numbers. Attention is the ``eager`` implementation (the
matmul/softmax graph Dynamo records; SDPA would be one opaque call) and the KV cache is
off, so the forward returns tensors only.

Size parameters (all optional, integers):

``layers`` (2), ``hidden`` (64), ``heads`` (4; ``hidden // 64`` when only ``hidden`` is
given), ``kv_heads`` (``heads``; grouped-query attention where the architecture has it),
``intermediate`` (``4 * hidden``), ``vocab`` (1000), ``seq`` (16), ``batch`` (2),
``image`` (32, vision models) and ``patch`` (8).

Inputs, by the architecture's kind: ``input_ids (batch, seq)`` int64 and
``attention_mask (batch, seq)`` int64 ones (``text``); the same plus
``decoder_input_ids (batch, seq // 2)`` (``seq2seq``); ``pixel_values (batch, 3, image,
image)`` float32 (``image``). :class:`TensorOutputs` turns the model's output into a
tuple of tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import torch
from torch import nn

PREFIX = "hf:"
PARAMS = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "seq", "batch", "image", "patch")
SMALL = {"layers": 2, "hidden": 64, "vocab": 1000, "seq": 16, "batch": 2, "image": 32, "patch": 8}

# config field <- size parameter, on top of the standard names every config maps
# (num_hidden_layers, hidden_size, num_attention_heads, intermediate_size)
_DECODER_STACK = {
    "decoder_layers": "layers",
    "encoder_layers": "layers",
    "encoder_ffn_dim": "intermediate",
    "decoder_ffn_dim": "intermediate",
    "encoder_attention_heads": "heads",
    "decoder_attention_heads": "heads",
    "d_model": "hidden",
}
_GQA = {"num_key_value_heads": "kv_heads", "head_dim": "head_dim"}


@dataclass(frozen=True)
class HFArch:
    """One architecture: ``hf:NAME`` builds ``AutoModel.from_config(AutoConfig.for_model(model_type, ...))``.

    ``kind`` is the input set (``text``, ``seq2seq``, ``image``); ``fields`` maps extra
    config fields to size parameters (``"head_dim"`` is ``hidden // heads``); ``fixed``
    holds config values this architecture needs at any size."""

    name: str
    model_type: str
    kind: str
    family: str
    fields: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)


ARCHITECTURES: dict[str, HFArch] = {
    a.name: a
    for a in [
        HFArch("bert", "bert", "text", "encoder"),
        HFArch("roberta", "roberta", "text", "encoder"),
        HFArch(
            "distilbert",
            "distilbert",
            "text",
            "encoder",
            {"dim": "hidden", "n_layers": "layers", "n_heads": "heads", "hidden_dim": "intermediate"},
        ),
        HFArch("albert", "albert", "text", "encoder", {"embedding_size": "hidden"}),
        HFArch("electra", "electra", "text", "encoder", {"embedding_size": "hidden"}),
        HFArch("xlm-roberta", "xlm-roberta", "text", "encoder"),
        HFArch("deberta-v2", "deberta-v2", "text", "encoder"),
        HFArch("mpnet", "mpnet", "text", "encoder"),
        HFArch(
            "mobilebert",
            "mobilebert",
            "text",
            "encoder",
            {"embedding_size": "hidden", "intra_bottleneck_size": "hidden", "true_hidden_size": "hidden"},
        ),
        HFArch("gpt2", "gpt2", "text", "decoder", {"n_inner": "intermediate"}),
        HFArch("gptj", "gptj", "text", "decoder", {"n_inner": "intermediate", "rotary_dim": "head_dim"}),
        HFArch("gpt_neox", "gpt_neox", "text", "decoder"),
        HFArch("opt", "opt", "text", "decoder", {"ffn_dim": "intermediate", "word_embed_proj_dim": "hidden"}),
        HFArch("bloom", "bloom", "text", "decoder", {"n_head": "heads"}),
        HFArch("falcon", "falcon", "text", "decoder", {"num_kv_heads": "kv_heads"}),
        HFArch("phi", "phi", "text", "decoder", _GQA),
        HFArch("llama", "llama", "text", "decoder", _GQA),
        HFArch("mistral", "mistral", "text", "decoder", _GQA, {"sliding_window": None}),
        HFArch("qwen2", "qwen2", "text", "decoder", _GQA),
        HFArch("qwen3", "qwen3", "text", "decoder", _GQA),
        HFArch("gemma", "gemma", "text", "decoder", _GQA),
        HFArch("gemma2", "gemma2", "text", "decoder", _GQA),
        HFArch("olmo", "olmo", "text", "decoder", _GQA),
        HFArch(
            "mixtral",
            "mixtral",
            "text",
            "decoder (mixture of experts)",
            _GQA,
            {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
        ),
        HFArch(
            "t5",
            "t5",
            "seq2seq",
            "encoder-decoder",
            {
                "d_model": "hidden",
                "d_ff": "intermediate",
                "num_layers": "layers",
                "num_decoder_layers": "layers",
                "num_heads": "heads",
                "d_kv": "head_dim",
            },
        ),
        HFArch("bart", "bart", "seq2seq", "encoder-decoder", _DECODER_STACK),
        HFArch("mbart", "mbart", "seq2seq", "encoder-decoder", _DECODER_STACK),
        HFArch("pegasus", "pegasus", "seq2seq", "encoder-decoder", _DECODER_STACK),
        HFArch("marian", "marian", "seq2seq", "encoder-decoder", _DECODER_STACK),
        HFArch("vit", "vit", "image", "vision encoder", {"image_size": "image", "patch_size": "patch"}),
        HFArch("deit", "deit", "image", "vision encoder", {"image_size": "image", "patch_size": "patch"}),
    ]
}


class HFSpecError(ValueError):
    """An ``hf:`` spec naming no known architecture or carrying a bad size parameter."""


def hf_list() -> list[tuple[str, str, str]]:
    """(spec, family, input kind) of every architecture, in table order."""
    return [(PREFIX + a.name, a.family, a.kind) for a in ARCHITECTURES.values()]


def parse_spec(spec: str) -> tuple[HFArch, dict[str, int]]:
    """``hf:NAME?k=v&...`` -> (architecture, every size parameter resolved).

    Raises HFSpecError for an unknown architecture, an unknown or non-integer
    parameter, or sizes that do not divide (``hidden`` by ``heads``, ``heads`` by
    ``kv_heads``, ``image`` by ``patch``)."""
    body = spec.strip().removeprefix(PREFIX)
    name, _, query = body.partition("?")
    if name not in ARCHITECTURES:
        raise HFSpecError(
            f"unknown HF architecture {name!r}; known: {', '.join(ARCHITECTURES)} (`optimus sweep --list-hf`)"
        )
    given: dict[str, int] = {}
    for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if k not in PARAMS:
            raise HFSpecError(f"{spec}: unknown size parameter {k!r}; known: {', '.join(PARAMS)}")
        try:
            given[k] = int(v)
        except ValueError:
            raise HFSpecError(f"{spec}: {k}={v!r} is not an integer") from None
        if given[k] < 1:
            raise HFSpecError(f"{spec}: {k} must be at least 1, got {given[k]}")
    p = {**SMALL, **given}
    p.setdefault("heads", 4 if "hidden" not in given else max(1, p["hidden"] // 64))
    p.setdefault("kv_heads", p["heads"])
    p.setdefault("intermediate", 4 * p["hidden"])
    for a, b in (("hidden", "heads"), ("heads", "kv_heads"), ("image", "patch")):
        if p[a] % p[b]:
            raise HFSpecError(f"{spec}: {a}={p[a]} is not a multiple of {b}={p[b]}")
    p["head_dim"] = p["hidden"] // p["heads"]
    return ARCHITECTURES[name], p


def hf_config(arch: HFArch, p: dict[str, int]):
    """The ``transformers`` config of ``arch`` at sizes ``p`` (see :func:`parse_spec`)."""
    from transformers import AutoConfig

    kw = {
        "num_hidden_layers": p["layers"],
        "hidden_size": p["hidden"],
        "num_attention_heads": p["heads"],
        "intermediate_size": p["intermediate"],
        "use_cache": False,
    }
    if arch.kind != "image":
        kw.update(
            vocab_size=p["vocab"],
            max_position_embeddings=max(64, 2 * p["seq"]),
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=0,
        )
    kw.update({k: p[v] for k, v in arch.fields.items()})
    kw.update(arch.fixed)
    config = AutoConfig.for_model(arch.model_type, **kw)
    config._attn_implementation = "eager"
    return config


class TensorOutputs(nn.Module):
    """A HF model called with keyword inputs named ``names`` from positional tensors,
    its output (``return_dict=False``) reduced to the tuple of its tensors, e.g.
    ``(last_hidden_state (B, T, hidden), pooler_output (B, hidden))`` for BERT."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.names, inputs)), return_dict=False)
        return tuple(o for o in out if isinstance(o, torch.Tensor))


def _inputs(kind: str, p: dict[str, int]) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    b, t = p["batch"], p["seq"]
    if kind == "image":
        return ("pixel_values",), (torch.randn(b, 3, p["image"], p["image"]),)
    ids = torch.randint(3, p["vocab"], (b, t), dtype=torch.int64)
    mask = torch.ones(b, t, dtype=torch.int64)
    if kind == "seq2seq":
        return ("input_ids", "attention_mask", "decoder_input_ids"), (ids, mask, ids[:, : max(1, t // 2)].clone())
    return ("input_ids", "attention_mask"), (ids, mask)


def load_hf(spec: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], str]:
    """Build ``hf:NAME[?k=v&...]`` offline: (TensorOutputs model in eval mode, example
    inputs, the spec as display name).

    Raises HFSpecError for a bad spec, ImportError (with the install command) when
    ``transformers`` is missing, and what ``transformers`` raises for a configuration it
    refuses."""
    arch, p = parse_spec(spec)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers import AutoModel
    except ImportError as e:
        raise ImportError("hf: models need the `transformers` package: pip install 'optimus-lens[models]'") from e
    config = hf_config(arch, p)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf_model = AutoModel.from_config(config, attn_implementation="eager")
        names, inputs = _inputs(arch.kind, p)
    return TensorOutputs(hf_model, names).eval(), inputs, spec.strip()
