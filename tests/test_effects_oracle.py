"""Never silently wrong: the default pipeline, verification off, against eager PyTorch.

Each class of issue 21's analysis half has its own models (inputs of their own). Every
case runs twice on identical fresh copies (same seed, so same weights and inputs, the
inputs aliasing as the factory made them): eagerly, and under a plain Dynamo backend that
runs ``optimus_lens.run_pipeline`` with ``verify="off"`` (as ``optimus_lens.compile``
does) and then runs the rewritten graph. Compared, as an independent oracle (not the
product's verification): output structure, dtypes and values, which outputs overlap an
input's or another output's memory, the inputs' values after the call, and for the
gradient cases the gradients of parameters and inputs. Each test also checks that the
patterns still fire where it is safe: the reads on one side of a write fuse among
themselves, the members of one region fuse.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from optimus_lens import RunOptions, run_pipeline


@torch.library.custom_op("optimus_test21::fill_from", mutates_args=("buf",))
def fill_from(buf: torch.Tensor, src: torch.Tensor) -> None:
    """Copies ``src`` into ``buf``: a write the op's name does not announce."""
    buf.copy_(src)


@fill_from.register_fake
def _(buf, src):
    return None


# --------------------------------------------------------------------------- the oracle


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat(v)]
    return []


def _span(t):
    if t.numel() == 0:
        return (t.untyped_storage().data_ptr(), 0, 0)
    lo = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    hi = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0) + 1
    return (t.untyped_storage().data_ptr(), lo * t.element_size(), hi * t.element_size())


def _overlaps(outs, ins):
    def ov(a, b):
        (sa, la, ha), (sb, lb, hb) = _span(a), _span(b)
        return sa == sb and la < hb and lb < ha

    return [
        (tuple(j for j, t in enumerate(ins) if ov(o, t)), tuple(j for j, t in enumerate(outs) if j != i and ov(o, t)))
        for i, o in enumerate(outs)
    ]


def _close(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {b.shape} {b.dtype} instead of {a.shape} {a.dtype}"
    tol = dict(rtol=2e-2, atol=2e-2) if a.dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b, a, **tol, msg=lambda m: f"{what}: {m}")


def eager_vs_rewritten(factory, grads: bool = False):
    """Run ``factory()``'s model eagerly and rewritten (see the module docstring); assert
    they agree. Returns the steps the pipeline made (every graph Dynamo compiled), each as
    ``(pattern, sites, error)``."""
    steps: list[tuple[str, list[str], object]] = []

    def backend(gm, example_inputs):
        trace = run_pipeline(gm, tuple(example_inputs), None, RunOptions(verify="off"))
        steps.extend((s.pattern, list(s.sites), s.error) for s in trace.steps)
        return gm.forward

    results = []
    for rewritten in (False, True):
        torch.manual_seed(0)
        model, inputs = factory()
        torch._dynamo.reset()
        fn = torch.compile(model, backend=backend) if rewritten else model
        if grads:
            inputs = tuple(t.requires_grad_() if t.is_leaf and t.is_floating_point() else t for t in inputs)
            out = fn(*inputs)
            sum(o.float().sum() for o in _flat(out)).backward()
            g = [p.grad for p in model.parameters()] + [t.grad if t.is_leaf else None for t in inputs]
        else:
            with torch.no_grad():
                out = fn(*inputs)
            g = []
        outs = _flat(out)
        results.append((outs, _overlaps(outs, inputs), [t.detach().clone() for t in inputs], g))
    torch._dynamo.reset()
    (eo, ea, ei, eg), (ro, ra, ri, rg) = results
    assert len(eo) == len(ro)
    for i, (a, b) in enumerate(zip(eo, ro)):
        _close(a.detach(), b.detach(), f"output {i}")
    assert ea == ra, f"output overlaps differ: eager {ea}, rewritten {ra}"
    for i, (a, b) in enumerate(zip(ei, ri)):
        _close(a, b, f"input {i} after the call")
    for i, (a, b) in enumerate(zip(eg, rg)):
        assert (a is None) == (b is None), f"gradient {i}: None-ness differs"
        if a is not None:
            _close(a, b, f"gradient {i}")
    assert not [s for s in steps if s[2] is not None], f"rolled-back steps: {[s for s in steps if s[2]]}"
    return steps


def fused(steps, pattern: str) -> list[list[str]]:
    return [sites for p, sites, _ in steps if p == pattern]


class Lins(nn.Module):
    """``n`` Linear(8, 8)."""

    def __init__(self, n: int = 6):
        super().__init__()
        self.l = nn.ModuleList(nn.Linear(8, 8) for _ in range(n))


# --------------------------------------------------------------------------- writes the name does not say


class CustomOpBetween(Lins):
    """Three linears read ``h``, a custom op declared ``mutates_args=("buf",)`` fills ``h``
    from ``src``, three more linears read it. Inputs h (4, 8), src (4, 8)."""

    def forward(self, h, src):
        a = [self.l[i](h) for i in range(3)]
        torch.ops.optimus_test21.fill_from(h, src)
        b = [self.l[i](h) for i in range(3, 6)]
        return torch.cat(a + b, 1)


class AtenMulBetween(Lins):
    """``torch.ops.aten.mul_.Tensor`` called directly on a copy of the input, between two
    groups of three linears that read it. Input x (4, 8)."""

    def forward(self, x):
        h = x.clone()
        a = [self.l[i](h) for i in range(3)]
        torch.ops.aten.mul_.Tensor(h, 3.0)
        b = [self.l[i](h) for i in range(3, 6)]
        return torch.cat(a + b, 1)


WRITES = {
    "custom_op_mutates_args": lambda: (CustomOpBetween(), (torch.randn(4, 8), torch.randn(4, 8))),
    "aten_mul_overload": lambda: (AtenMulBetween(), (torch.randn(4, 8),)),
}


@pytest.mark.parametrize("case", sorted(WRITES))
def test_a_write_the_name_does_not_announce_splits_the_reads_into_two_groups(case):
    steps = eager_vs_rewritten(WRITES[case])
    groups = fused(steps, "batch_linear_lhs")
    assert sorted(len(g) for g in groups) == [3, 3]  # each side of the write fuses on its own
    assert all({int(s.rsplit("_", 1)[-1]) if "_" in s else 0 for s in g} in ({0, 1, 2}, {3, 4, 5}) for g in groups)


# --------------------------------------------------------------------------- aliases the names do not show


class WriteThrough(Lins):
    """Three linear+relu read ``h = x * 1``, then a write into ``h`` through an alias of
    it (``how``), then three more. Input x (8, 8)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        h = x * 1.0
        a = [torch.relu(self.l[i](h)) for i in range(3)]
        if self.how == "T":
            h.T.mul_(2)
        elif self.how == "mT":
            h.mT.add_(1)
        elif self.how == "real":
            h.real.mul_(2)
        elif self.how == "atleast_2d":
            torch.atleast_2d(h).mul_(2)
        else:
            h.contiguous().sub_(1)
        b = [torch.relu(self.l[i](h)) for i in range(3, 6)]
        return torch.cat(a + b, 1)


@pytest.mark.parametrize("how", ["T", "mT", "real", "atleast_2d", "contiguous"])
def test_a_write_through_an_alias_orders_the_reads_of_the_aliased_tensor(how):
    steps = eager_vs_rewritten(lambda: (WriteThrough(how), (torch.randn(8, 8),)))
    assert sorted(len(g) for g in fused(steps, "batch_linear_lhs")) == [3, 3]


class OverlappingInputs(Lins):
    """``a`` and ``b`` are two views of one buffer; ``b`` is written between two groups of
    linears that read ``a``. Inputs a, b: (4, 8) views of one (4, 8) tensor."""

    def forward(self, a, b):
        x = [self.l[i](a) for i in range(3)]
        b.mul_(2)
        y = [self.l[i](a) for i in range(3, 6)]
        return torch.cat(x + y, 1)


def _overlapping():
    base = torch.randn(4, 8)
    return OverlappingInputs(), (base[:, :], base.view(4, 8))


def test_inputs_that_are_views_of_one_buffer_are_one_alias_class():
    steps = eager_vs_rewritten(_overlapping)
    assert sorted(len(g) for g in fused(steps, "batch_linear_lhs")) == [3, 3]


# --------------------------------------------------------------------------- outputs that alias


class CatOfSplit(nn.Module):
    """``cat(split(x))``, an identity, returned as the output. Input x (4, 8)."""

    def forward(self, x):
        return torch.cat(torch.split(x, [3, 5], 1), 1)


class CatOfSplitAndItsInput(nn.Module):
    """``y = 2x`` and ``cat(split(y))`` both returned. Input x (4, 8)."""

    def forward(self, x):
        y = x * 2
        return torch.cat(torch.split(y, [3, 5], 1), 1), y


class StackOfUnbind(nn.Module):
    """``stack(unbind(x))`` returned, and the same identity read by a product. Input x (3, 4, 8)."""

    def forward(self, x):
        return torch.stack(torch.unbind(x, 1), 1), 2 * torch.stack(torch.unbind(x, 1), 1)


OUTPUTS = {
    "cat_split_is_the_input": lambda: (CatOfSplit(), (torch.randn(4, 8),)),
    "cat_split_is_another_output": lambda: (CatOfSplitAndItsInput(), (torch.randn(4, 8),)),
    "stack_unbind_is_the_input": lambda: (StackOfUnbind(), (torch.randn(3, 4, 8),)),
}


@pytest.mark.parametrize("case", sorted(OUTPUTS))
def test_an_identity_never_makes_an_output_overlap_an_input_or_another_output(case):
    steps = eager_vs_rewritten(OUTPUTS[case])
    if case == "stack_unbind_is_the_input":  # the copy the product reads is still removed
        assert len(fused(steps, "remove_unbind_stack")) == 1


def test_why_names_the_output_an_identity_would_alias():
    from optimus_lens.core.pattern import why_not
    from optimus_lens.frontend.capture import capture
    from optimus_lens.passes import pattern_named

    gm = capture(CatOfSplit(), (torch.randn(4, 8),)).gm
    cat = next(n for n in gm.graph.nodes if n.target is torch.cat)
    reason = why_not(pattern_named("remove_split_cat"), cat)
    assert reason is not None and "graph output 0 would overlap input 0" in reason


# --------------------------------------------------------------------------- grad-mode and autocast regions


class NoGradBlock(Lins):
    """Three linears with grad, three inside ``torch.no_grad()``, all on x. Input x (4, 8)."""

    def forward(self, x):
        a = [self.l[i](x) for i in range(3)]
        with torch.no_grad():
            b = [self.l[i](x) for i in range(3, 6)]
        return torch.cat(a + b, 1)


class AutocastBlock(Lins):
    """Three linears in fp32, three inside ``torch.autocast("cpu", bfloat16)``. Input x (4, 8)."""

    def forward(self, x):
        a = [self.l[i](x) for i in range(3)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = [self.l[i](x) for i in range(3, 6)]
        return [*a, *b]


def test_no_group_spans_a_no_grad_block_and_gradients_stay_as_in_eager():
    steps = eager_vs_rewritten(lambda: (NoGradBlock(), (torch.randn(4, 8),)), grads=True)
    assert sorted(len(g) for g in fused(steps, "batch_linear_lhs")) == [3, 3]


def test_no_group_spans_an_autocast_block_and_its_members_stay_bf16():
    steps = eager_vs_rewritten(lambda: (AutocastBlock(), (torch.randn(4, 8),)))
    assert sorted(len(g) for g in fused(steps, "batch_linear_lhs")) == [3, 3]


# --------------------------------------------------------------------------- dtype promotion


class StackUnbindMixed(nn.Module):
    """``unbind(stack([a_fp32, b_bf16]))``: the stack promotes b to fp32. Inputs (4, 8) each."""

    def forward(self, a, b):
        return [t * 1 for t in torch.unbind(torch.stack([a, b]))]


class CatSplitMixed(nn.Module):
    """``split(cat([a_fp32, b_bf16], 1))``: the cat promotes b. Inputs (4, 8) each."""

    def forward(self, a, b):
        return [t * 1 for t in torch.split(torch.cat([a, b], 1), [8, 8], 1)]


class Bf16TimesZeroDim(nn.Module):
    """A bf16 tensor times three 0-dim fp32 scalars: each product is bf16. Inputs x (4, 8) bf16, c0..c2 ()."""

    def forward(self, x, c0, c1, c2):
        return [x * c0, x * c1, x * c2]


class Bf16TimesBf16ZeroDim(nn.Module):
    """The same with bf16 scalars: nothing promotes, the products fuse."""

    def forward(self, x, c0, c1, c2):
        return [x * c0, x * c1, x * c2]


def _mixed():
    return torch.randn(4, 8), torch.randn(4, 8).bfloat16()


DTYPES = {
    "stack_unbind_mixed": lambda: (StackUnbindMixed(), _mixed()),
    "cat_split_mixed": lambda: (CatSplitMixed(), _mixed()),
    "bf16_times_fp32_zero_dim": lambda: (
        Bf16TimesZeroDim(),
        (torch.randn(4, 8).bfloat16(), torch.tensor(2.0), torch.tensor(3.0), torch.tensor(0.5)),
    ),
}


@pytest.mark.parametrize("case", sorted(DTYPES))
def test_promoting_stacks_and_cats_keep_the_dtype_eager_computes(case):
    eager_vs_rewritten(DTYPES[case])


def test_bf16_products_with_bf16_zero_dim_operands_still_fuse():
    steps = eager_vs_rewritten(
        lambda: (
            Bf16TimesBf16ZeroDim(),
            (torch.randn(4, 8).bfloat16(), *(torch.tensor(v).bfloat16() for v in (2.0, 3.0, 0.5))),
        )
    )
    assert [len(g) for g in fused(steps, "batch_mul")] == [3]


# --------------------------------------------------------------------------- storage offsets


class AsStridedOffset(Lins):
    """Twelve linears on the twelve (4, 8) pieces of x: six read by
    ``as_strided(y, (2, 4), (8, 1), 4)`` (an explicit storage offset), six by a cat. A
    fused member is a contiguous slice of the stacked result, so its strides match and
    only its offset differs. Input x (4, 96)."""

    def __init__(self):
        super().__init__(12)

    def forward(self, x):
        p = torch.split(x, 8, 1)
        ys = [self.l[i](p[i]) for i in range(6)]
        zs = [self.l[i](p[i]) for i in range(6, 12)]
        return [torch.as_strided(y, (2, 4), (8, 1), 4) for y in ys] + [torch.cat(zs, 1)]


def test_a_member_read_through_as_strided_with_an_offset_is_not_fused():
    steps = eager_vs_rewritten(lambda: (AsStridedOffset(), (torch.randn(4, 96),)))
    (group,) = fused(steps, "batch_linear")
    assert len(group) == 6  # the six linears no use reads the offset of
