"""Verification sees what a user's program sees: pristine inputs that keep their aliasing,
output dtypes, which outputs overlap inputs or each other, and the inputs after the call.

Each comparison has a case of its own: an original program and a rewritten one that
differs from it in exactly that respect (values and strides equal otherwise).
"""

import pytest
import torch
from torch.fx import symbolic_trace

from optimus_lens.core import verify
from optimus_lens.core.storage import clone_preserving_aliases, overlap_signature, overlaps
from optimus_lens.frontend.capture import capture


def graph(fn):
    return symbolic_trace(fn)


# ---------------------------------------------------------------- copies that keep aliasing


def test_copies_keep_which_inputs_share_memory_and_share_none_with_the_originals():
    base = torch.arange(10.0)
    x, y, z = base[0:6], base[4:10], torch.ones(3)
    p = torch.nn.Parameter(torch.randn(2))
    cx, cy, cz, cp = clone_preserving_aliases((x, y, z, p))
    assert overlaps(cx, cy) and not overlaps(cx, cz)
    assert not any(overlaps(c, o) for c in (cx, cy, cz, cp) for o in (x, y, z, p))
    assert (cx.storage_offset(), cy.storage_offset(), cy.stride()) == (0, 4, (1,))
    assert isinstance(cp, torch.nn.Parameter) and cp.requires_grad
    cx[4] = -1.0  # a write through one copy is read through the other, as in the originals
    assert cy[0] == -1.0 and y[0] == 4.0


def test_overlap_signature_names_inputs_and_other_outputs_an_output_shares_memory_with():
    x = torch.randn(4, 4)
    outs = [x[1], x.clone(), x[1:3]]
    assert overlap_signature(outs, (x,)) == [((0,), (2,)), ((), ()), ((0,), (0,))]


# ---------------------------------------------------------------- the capture never writes the caller's tensors


class WritesItsInputAndABuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(2))

    def forward(self, x):
        y = x * 2
        x.add_(1)
        self.calls.add_(1)
        return y + x


def test_the_capture_leaves_the_callers_input_and_the_models_buffer_unwritten_and_keeps_pristine_example_inputs():
    model, x = WritesItsInputAndABuffer(), torch.zeros(2)
    c = capture(model, (x,))
    assert torch.equal(x, torch.zeros(2)) and torch.equal(model.calls, torch.zeros(2))
    # the example inputs are the values the model received, not the ones its capture run wrote
    assert all(torch.equal(t, torch.zeros(2)) for t in c.example_inputs)
    ref = verify.reference(c.gm, c.example_inputs)
    assert torch.equal(ref.outputs[0], torch.ones(2))  # 0 * 2 + (0 + 1): computed on unwritten data
    assert torch.equal(x, torch.zeros(2)) and torch.equal(model.calls, torch.zeros(2))
    assert verify.check(c.gm, c.example_inputs, ref).ok


# ---------------------------------------------------------------- each comparison on a case of its own


def test_a_dtype_that_differs_is_named():
    ref_gm = graph(lambda x: x * 2)
    bad = graph(lambda x: (x * 2).half())
    x = (torch.randn(4),)
    res = verify.check(bad, x, verify.reference(ref_gm, x))
    assert res.ok is False and res.checked == "dtypes"
    assert res.message == "output 0: dtype torch.float16 instead of torch.float32"


def test_an_output_that_now_is_the_input_is_an_aliasing_failure():
    # cat(split(x)) -> x: the same values, but the caller's write into the output now changes the input
    ref_gm = graph(lambda x: torch.cat(torch.split(x, 2, dim=1), dim=1))

    def identity(x):
        return x

    bad = graph(identity)
    x = (torch.randn(3, 4),)
    res = verify.check(bad, x, verify.reference(ref_gm, x))
    assert res.ok is False and res.checked == "aliasing"
    assert res.message.startswith("output 0 now overlaps input 0")


def test_two_outputs_that_became_one_tensor_are_an_aliasing_failure():
    ref_gm = graph(lambda x: (x.relu(), x.relu()))

    def one_relu(x):
        r = x.relu()
        return r, r

    x = (torch.randn(5),)
    res = verify.check(graph(one_relu), x, verify.reference(ref_gm, x))
    assert res.ok is False and res.checked == "aliasing"
    assert res.message.startswith("output 0 now overlaps output 1")


def test_an_output_that_no_longer_aliases_its_input_is_named_too():
    def view(x):
        return x.view(-1)

    def copy(x):
        return x.reshape(-1).clone()

    x = (torch.randn(2, 3),)
    res = verify.check(graph(copy), x, verify.reference(graph(view), x))
    assert res.ok is False and res.message.startswith("output 0 no longer overlaps input 0")


def test_an_in_place_write_the_rewrite_dropped_is_an_input_writes_failure():
    def writes(x):
        y = x * 3
        x.mul_(2)
        return y

    def forgets(x):
        return x * 3

    x = (torch.randn(4),)
    ref = verify.reference(graph(writes), x)
    assert ref.written[0] is not None
    res = verify.check(graph(forgets), x, ref)
    assert res.ok is False and res.checked == "input-writes"
    assert res.message.startswith("input 0 after the call differs: max abs err")
    assert "the original writes it, the rewritten graph leaves it unchanged" in res.message


def test_a_write_the_original_did_not_make_is_an_input_writes_failure():
    def reads(x):
        return x + 1

    def writes(x):
        return x.add_(1).clone()

    x = (torch.randn(4),)
    res = verify.check(graph(writes), x, verify.reference(graph(reads), x))
    assert res.ok is False and res.checked == "input-writes"
    assert "the original leaves it unchanged, the rewritten graph writes it" in res.message
    assert torch.equal(x[0], x[0])  # the caller's tensor itself is never written (copies only)


def test_overlapping_input_views_stay_overlapping_so_a_read_moved_across_a_write_is_caught():
    def in_order(x, y):
        x.add_(10)
        return y * 2  # reads what the write into x left in the shared elements

    def read_first(x, y):
        out = y * 2
        x.add_(10)
        return out

    base = torch.arange(6.0)
    inputs = (base[0:4], base[2:6])  # elements 2 and 3 are shared
    ref = verify.reference(graph(in_order), inputs)
    assert torch.equal(ref.outputs[0], torch.tensor([24.0, 26.0, 8.0, 10.0]))  # as eager computes it
    assert torch.equal(base, torch.arange(6.0))  # the caller's buffer is untouched
    res = verify.check(graph(read_first), inputs, ref)
    assert res.ok is False and res.checked == "outputs"
    # cloned on their own, the inputs would not share memory and the two programs would agree
    separate = tuple(t.clone() for t in inputs)
    assert verify.check(graph(read_first), separate, verify.reference(graph(in_order), separate)).ok


def test_gradients_through_overlapping_input_views_are_those_of_the_shared_memory():
    def f(x, y):
        return x * y[0]

    base = torch.arange(1.0, 5.0)
    inputs = (base[0:3], base[1:4])
    ref = verify.reference(graph(f), inputs, grads=True)
    g_x, g_y = ref.grads
    assert g_x is not None and g_y is not None and g_x.shape == (3,) and g_y.shape == (3,)
    # y[0] and x[1] are one element: both views see the gradient of the shared storage
    assert g_x[1] == g_y[0]
    assert verify.check(graph(f), inputs, ref, grads=True).ok


def test_a_failing_aliasing_check_is_in_the_trace_and_in_the_report(tmp_path, monkeypatch):
    """Verification is the second line: with the engine's step check (core/stepcheck.py,
    which refuses this rewrite before it happens) off, the step that makes an output share
    the input's storage is caught by verification, and the report says so."""
    from optimus_lens.core.stepcheck import StepCheck

    monkeypatch.setattr(StepCheck, "verify", lambda self, *a, **k: None)
    from optimus_lens import sample_models  # noqa: F401 - the package import registers the samples
    from optimus_lens.frontend.patternfile import load_pattern_file, pipeline_with
    from optimus_lens.frontend.run import optimize
    from optimus_lens.viz import html_report

    class ClonesItsInput(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).clone()

    f = tmp_path / "drop_clone.py"
    f.write_text(
        "import torch\n\n\ndef pattern(x):\n    return torch.relu(x).clone()\n\n\n"
        "def replacement(x):\n    return torch.relu_(x)\n"
    )
    pipe = pipeline_with(load_pattern_file(f), passes=["drop_clone"])
    trace = optimize(ClonesItsInput(), (torch.randn(4),), pipeline=pipe, verify="step").trace
    (step,) = trace.steps
    assert step.verify.ok is False and step.verify.checked in ("aliasing", "input-writes")
    assert "input 0" in step.verify.message
    html = html_report(trace)
    assert step.verify.message.split(" (")[0] in html


@pytest.mark.parametrize("fn", [lambda x: x.t(), lambda x: x[1:]])
def test_outputs_that_are_views_of_the_input_in_both_programs_pass(fn):
    x = (torch.randn(3, 3),)
    assert verify.check(graph(fn), x, verify.reference(graph(fn), x)).ok
