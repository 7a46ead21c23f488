"""``optimus samples`` and ``optimus passes``: what there is to run."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK
from optimus_lens.cli.jsonout import add_json, json_output
from optimus_lens.cli.text import samples_text


def add_parsers(sub) -> None:
    """Add ``samples`` and ``passes`` to the subcommands ``sub``."""
    sm = sub.add_parser("samples", help="list the sample models (MODEL sample:NAME)")
    add_json(sm, "the sample models and HF architectures")
    sm.set_defaults(fn=cmd_samples)
    ps = sub.add_parser("passes", help="list the patterns with description, preconditions and source")
    add_json(ps, "the patterns and passes")
    ps.set_defaults(fn=cmd_passes)


def cmd_samples(a: argparse.Namespace) -> int:
    """Print the sample models and the HF architectures."""
    from optimus_lens.frontend.hf import hf_list
    from optimus_lens.frontend.run import sample_list

    with json_output(a, "samples") as emit:
        print(samples_text())
        emit(
            {
                "samples": [
                    {"spec": f"sample:{n}", "name": n, "kind": k, "description": d} for n, k, d in sample_list()
                ],
                "hf": [{"spec": sp, "family": f, "inputs": i} for sp, f, i in hf_list()],
            }
        )
    return EXIT_OK


def cmd_passes(a: argparse.Namespace) -> int:
    """Print every pattern: name, stage (pre-grad: the Dynamo graph; post-grad: the ATen
    graphs), kind, the pass it is in, source; description, preconditions and the upstream
    pass it mirrors."""
    from optimus_lens.passes import default_pipeline, pass_catalogue
    from optimus_lens.passes.post_grad import post_grad_pipeline

    pre, post = default_pipeline(), post_grad_pipeline()
    in_pass: dict[str, str] = {}  # pattern -> the pass it runs in
    where: dict[str, str] = {}  # pattern -> where it runs, as text
    for pipe, what in ((pre, ""), (post, "post-grad ")):
        for q in pipe.passes:
            off = " (off by default)" if q.name in pipe.disabled else ""
            in_pass.update({p.name: q.name for p in q.patterns})
            where.update({p.name: f"in {what}pass {q.name}{off}" for p in q.patterns})
    catalogue = pass_catalogue()
    with json_output(a, "passes") as emit:
        for p in catalogue:
            place = where.get(p["name"], "not in the default pipeline (upstream_pipeline options only)")
            print(f"{p['name']}  [{p['stage']} {p['kind']} pattern, {place}]  {p['source']}")
            print(f"    {p['description']}")
            for c in p["preconditions"]:
                print(f"    - {c}")
            if p["upstream"]:
                print(f"    upstream: {p['upstream']}")
        emit(
            {
                "passes": [
                    {"name": q.name, "stage": stage, "patterns": [p.name for p in q.patterns]}
                    for stage, pipe in (("pre-grad", pre), ("post-grad", post))
                    for q in pipe.passes
                ],
                "patterns": [{**p, "pass": in_pass.get(p["name"])} for p in catalogue],
            }
        )
    return EXIT_OK
