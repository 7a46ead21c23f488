"""Training per pass, pre-grad and post-grad, ours beside upstream's (benchmarks/RESULTS.md,
"Training per pass").

For each model: ``optimus bench MODEL --stage all --mode training --against-upstream`` (the
same ``bench_pipeline`` call): forward + backward after each of our pre-grad passes (the
Dynamo graph under autograd), PyTorch's own pre-grad passes with the equivalent options
(``upstream``), then the ATen forward and backward graphs of our pre-grad output after
each of our post-grad passes (``post:<pass>``), upstream's ``post_grad_passes`` with no
Optimus options (``post:inductor``) and with the equivalent ones on the ATen graphs of
upstream's pre-grad output (``post:upstream``). All stages of one model in one run,
round-robin, p10..p90; one thread (thread CPU time) by default, as the other CPU tables.

Also checks node for node, for each model and mode, that the ATen graphs the bench (and
``optimus run --stage post-grad``) works on are the ones a real
``torch.compile(backend="inductor")`` hands ``post_grad_passes`` (``--check-capture``).

    .venv/bin/python benchmarks/post_grad_training.py --repeats 30 --json out.json
    .venv/bin/python benchmarks/post_grad_training.py --stage post-grad --repeats 30   # the post-grad passes alone
    .venv/bin/python benchmarks/post_grad_training.py --check-capture --models sample:mmoe
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

MODELS = ["sample:recsys_towers32", "sample:mmoe", "hf:llama"]


class _Stop(Exception):
    pass


def real_post_grad_graphs(model, inputs, training: bool) -> list:
    """(is_inference, graph) of each ``post_grad_passes`` call of a real
    ``torch.compile(backend="inductor")``, the compile of each graph cut short at that call
    (the graph then runs eagerly), so no code is generated (as in tests/test_aten_capture.py)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as inductor_config
    from torch._functorch.aot_autograd import make_boxed_func

    seen: list = []
    orig_passes, orig_inner = cfx.post_grad_passes, cfx._compile_fx_inner

    def record(gm, is_inference):
        seen.append((is_inference, copy.deepcopy(gm)))
        raise _Stop

    def inner(gm, example_inputs, **kw):
        try:
            return orig_inner(gm, example_inputs, **kw)
        except Exception as e:  # noqa: BLE001
            c = e
            while c is not None and not isinstance(c, _Stop):
                c = c.__cause__ or c.__context__
            if c is None:
                raise
            return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    cfx.post_grad_passes, cfx._compile_fx_inner = record, inner
    try:
        with (
            inductor_config.patch(fx_graph_cache=False, force_disable_caches=True),
            functorch_config.patch(enable_autograd_cache=False),
            torch.enable_grad() if training else torch.no_grad(),
        ):
            out = torch.compile(model, backend="inductor")(*inputs)
            if training:
                leaves = [o for o in torch.utils._pytree.tree_leaves(out) if o.requires_grad]
                torch.autograd.backward(leaves, [torch.ones_like(o) for o in leaves])
    finally:
        cfx.post_grad_passes, cfx._compile_fx_inner = orig_passes, orig_inner
        torch._dynamo.reset()
    return seen


def check_capture(spec: str, mode: str) -> dict:
    """Our ATen graphs of ``spec`` in ``mode`` against the real ones, node for node."""
    from optimus_lens.core.record import snapshot_graph
    from optimus_lens.frontend.aten_capture import capture_aten
    from optimus_lens.frontend.capture import capture
    from optimus_lens.frontend.run import load_model

    def nodes(gm):
        return [
            (r.name, r.op, r.target, r.args, r.kwargs, r.shape, r.dtype, r.stride)
            for r in snapshot_graph(gm.graph).nodes.values()
        ]

    model, inputs, _ = load_model(spec)
    model.train(mode == "training")
    ours = capture_aten(capture(model, inputs).gm, capture(model, inputs).example_inputs, mode)
    real = real_post_grad_graphs(model, inputs, mode == "training")
    same = len(real) == len(ours.graphs) and all(
        g.is_inference == inf and nodes(g.gm) == nodes(gm) for g, (inf, gm) in zip(ours.graphs, real)
    )
    return {
        "model": spec,
        "mode": mode,
        "graphs": [f"{g.name} {len(g.gm.graph.nodes)} nodes" for g in ours.graphs],
        "real": [f"{'inference' if inf else 'training'} {len(gm.graph.nodes)} nodes" for inf, gm in real],
        "node_for_node_equal": same,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also each stage under torch.compile (Inductor)")
    ap.add_argument(
        "--stage", choices=["all", "post-grad"], default="all", help="post-grad: our post-grad passes alone"
    )
    ap.add_argument("--check-capture", action="store_true", help="only the node-for-node capture check")
    ap.add_argument("--json", help="write every result here")
    a = ap.parse_args()
    results: dict = {}
    if a.check_capture:
        for spec in a.models:
            for mode in ("inference", "training"):
                r = check_capture(spec, mode)
                print(json.dumps(r))
                results[f"{spec} {mode}"] = r
    else:
        from optimus_lens.perf.bench import bench_pipeline

        for spec in a.models:
            t0 = time.perf_counter()
            r = bench_pipeline(
                spec,
                repeats=a.repeats,
                warmup=a.warmup,
                mode="training",
                stage=a.stage,
                against_upstream=True,
                reference=False,
                threads=a.threads,
                compile=a.compile,
            )
            print(f"\n## {spec} ({time.perf_counter() - t0:.0f} s)\n{r.table()}")
            results[spec] = r.to_json()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
