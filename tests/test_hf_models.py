"""``hf:NAME`` model specs (optimus/hf.py): HuggingFace architectures built offline from
small configs with random weights, through the same resolver as every other spec."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from optimus_lens import cli  # noqa: E402
from optimus_lens.frontend.hf import ARCHITECTURES, hf_list, parse_spec  # noqa: E402
from optimus_lens.frontend.run import ModelSpecError, load_model, optimize  # noqa: E402


def test_the_list_names_at_least_ten_architectures_of_every_input_kind():
    specs = [s for s, _, _ in hf_list()]
    assert len(specs) >= 10 and all(s.startswith("hf:") for s in specs)
    assert {"hf:bert", "hf:gpt2", "hf:t5", "hf:llama", "hf:vit"} <= set(specs)
    assert {k for _, _, k in hf_list()} == {"text", "seq2seq", "image"}


def test_size_parameters_reach_the_config_and_full_size_derives_heads_and_width():
    model, inputs, name = load_model("hf:llama?layers=3&hidden=96&heads=6&kv_heads=2&seq=5")
    c = model.model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (3, 96, 6, 2)
    assert c.intermediate_size == 4 * 96 and name == "hf:llama?layers=3&hidden=96&heads=6&kv_heads=2&seq=5"
    assert [tuple(t.shape) for t in inputs] == [(2, 5), (2, 5)]
    _, p = parse_spec("hf:bert?layers=12&hidden=768")
    assert (p["layers"], p["hidden"], p["heads"], p["intermediate"]) == (12, 768, 12, 3072)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hf:nope", "unknown HF architecture 'nope'"),
        ("hf:bert?depth=3", "unknown size parameter 'depth'"),
        ("hf:bert?layers=two", "layers='two' is not an integer"),
        ("hf:bert?hidden=100&heads=3", "hidden=100 is not a multiple of heads=3"),
        ("hf:bert?layers=0", "layers must be at least 1"),
    ],
)
def test_a_bad_hf_spec_is_a_model_spec_error_naming_the_problem(spec, message):
    with pytest.raises(ModelSpecError, match=message.replace("?", r"\?")):
        load_model(spec)


def test_two_builds_of_one_spec_have_the_same_weights_and_inputs():
    (m1, i1, _), (m2, i2, _) = load_model("hf:gpt2"), load_model("hf:gpt2")
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert all(torch.equal(a, b) for a, b in zip(i1, i2))


@pytest.mark.parametrize("name", ["bert", "llama", "t5", "vit"])
def test_one_architecture_of_each_family_captures_in_one_graph_and_verifies(name):
    assert name in ARCHITECTURES
    t = optimize(f"hf:{name}", verify="end").trace
    assert t.capture["graphs"] == 1 and t.steps
    assert t.final_verify.ok is True


def test_optimus_run_accepts_an_hf_spec(capsys):
    assert cli.main(["run", "hf:distilbert", "--passes", "batch_linear_lhs"]) == 0
    assert "batch_linear_lhs" in capsys.readouterr().out


def test_sweep_list_hf_prints_every_architecture(capsys):
    assert cli.main(["sweep", "--list-hf"]) == 0
    out = capsys.readouterr().out
    assert all(s in out for s, _, _ in hf_list()) and "layers=12&hidden=768" in out
