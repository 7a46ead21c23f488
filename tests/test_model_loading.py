"""Model specs: module and file factories resolved from the current directory, .pt2 exported
programs, the sample list, --skip, and upstream pass names (optimus/frontend/run.py, optimus/cli/)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from optimus_lens.cli import main
from optimus_lens.frontend.run import ModelSpecError, load_model, optimize
from optimus_lens.inductor.observe import known_pre_grad_passes
from optimus_lens.passes import upstream_pipeline

REPO = Path(__file__).resolve().parent.parent

FACTORY = textwrap.dedent("""
    import torch

    class Towers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(6))

        def forward(self, x):
            return torch.cat([torch.relu(l(p)) for l, p in zip(self.lin, torch.split(x, 8, 1))], 1)

    def build():
        torch.manual_seed(0)
        return Towers().eval(), (torch.randn(3, 48),)
""")


def test_module_factory_resolves_from_the_current_directory_through_the_installed_script(tmp_path):
    (tmp_path / "mymodels.py").write_text(FACTORY)
    # -P: like the console script, nothing puts the current directory on sys.path
    code = "import sys; from optimus_lens.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run(
        [sys.executable, "-P", "-c", code, "run", "mymodels:build"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    assert "batch_linear" in r.stdout
    assert str(tmp_path) not in sys.path


def test_file_factory_loads_by_path_and_bad_specs_say_what_is_wrong(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "towers.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    model, inputs, name = load_model("sub/towers.py:build")
    assert type(model).__name__ == "Towers" and inputs[0].shape == (3, 48) and name == "sub/towers.py:build"
    with pytest.raises(ModelSpecError, match="no such model file"):
        load_model("sub/nope.py:build")
    with pytest.raises(ModelSpecError, match="has no callable 'make'"):
        load_model("sub/towers.py:make")
    with pytest.raises(ModelSpecError, match="cannot import 'nomodule'"):
        load_model("nomodule:build")


def test_a_factory_spec_without_its_colon_says_how_to_write_it_not_which_samples_exist(tmp_path, monkeypatch):
    (tmp_path / "towers.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSpecError, match=r"'towers.py' names a file but no factory: write towers.py:build") as e:
        load_model("towers.py")
    assert "functions in it: build" in str(e.value) and "recsys_towers" not in str(e.value)
    with pytest.raises(ModelSpecError, match=r"no file 'nope.py'"):
        load_model("nope.py")
    with pytest.raises(ModelSpecError, match=r"'pkg.models' has no ':factory': write pkg.models:FACTORY"):
        load_model("pkg.models")
    with pytest.raises(ModelSpecError, match=r"unknown sample model 'recsys_tower'; did you mean recsys_towers") as e:
        load_model("recsys_tower")
    assert "mmoe" not in str(e.value)  # close names only, not the list of every sample
    assert load_model("teach_batch_relu")[2] == "teach_batch_relu"  # a bare sample name still loads


def test_a_pt2_exported_program_loads_with_its_example_inputs_and_fuses_like_the_eager_model(tmp_path, monkeypatch):
    (tmp_path / "towers.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    model, inputs, _ = load_model("towers.py:build")
    torch.export.save(torch.export.export(model, inputs), tmp_path / "towers.pt2")
    gm, ex, name = load_model(str(tmp_path / "towers.pt2"))
    assert name == "towers.pt2" and torch.equal(ex[0], inputs[0])
    torch.testing.assert_close(gm(*ex), model(*inputs))
    eager = optimize(model, inputs).trace
    exported = optimize(str(tmp_path / "towers.pt2")).trace
    assert [s.pattern for s in exported.steps] == [s.pattern for s in eager.steps]
    assert "batch_linear" in [s.pattern for s in exported.steps] and exported.final_verify.ok
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    assert main(["run", str(tmp_path / "junk.pt2")]) == 2


def test_samples_are_listed_by_the_samples_command_and_run_help(capsys):
    from optimus_lens import sample_models

    assert main(["samples"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in sample_models.names())
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "recsys_towers" in help_text and "teach_batch_layernorm" in help_text and ".pt2" in help_text


def test_skip_switches_passes_off_and_rejects_unknown_names(capsys):
    full = optimize("sample:recsys_towers", verify="off").trace
    skipped = optimize("sample:recsys_towers", skip=["batch_linear", "batch_relu"], verify="off").trace
    assert {"batch_linear", "batch_relu"} <= {s.pass_name for s in full.steps}
    assert not {"batch_linear", "batch_relu"} & {s.pass_name for s in skipped.steps}
    assert "batch_layernorm" in {s.pass_name for s in skipped.steps}
    only = optimize(
        "sample:recsys_towers", passes=["batch_linear", "batch_relu"], skip=["batch_relu"], verify="off"
    ).trace
    assert {s.pass_name for s in only.steps} == {"batch_linear"}
    assert main(["run", "sample:recsys_towers", "--skip", "batch_lienar"]) == 2
    assert "batch_lienar" in capsys.readouterr().err


def test_upstream_pipeline_accepts_every_pass_name_upstream_accepts():
    pipe = upstream_pipeline({name: {} for name in known_pre_grad_passes()})
    assert set(pipe.names()) == set(known_pre_grad_passes())
    (empty,) = [p for p in pipe.passes if p.name == "merge_stack_tahn_unbind_pass"]
    assert empty.patterns == [] and "no pre-grad pattern" in empty.description
