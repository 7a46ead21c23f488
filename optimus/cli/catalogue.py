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
    """Print every pattern: name, kind, the pass it is in, source; description,
    preconditions and the upstream pass it mirrors."""
    from optimus_lens.passes import default_pipeline, pass_catalogue

    pipe = default_pipeline()
    in_pass = {p.name: q.name for q in pipe.passes for p in q.patterns}
    catalogue = pass_catalogue()
    with json_output(a, "passes") as emit:
        _print_passes(catalogue, in_pass)
        emit(
            {
                "passes": [{"name": q.name, "patterns": [p.name for p in q.patterns]} for q in pipe.passes],
                "patterns": [{**p, "pass": in_pass.get(p["name"])} for p in catalogue],
            }
        )
    return EXIT_OK


def _print_passes(catalogue: list[dict], in_pass: dict[str, str]) -> None:
    for p in catalogue:
        where = (
            f"in pass {in_pass[p['name']]}"
            if p["name"] in in_pass
            else "not in the default pipeline (upstream_pipeline options only)"
        )
        print(f"{p['name']}  [{p['kind']} pattern, {where}]  {p['source']}")
        print(f"    {p['description']}")
        for c in p["preconditions"]:
            print(f"    - {c}")
        if p["upstream"]:
            print(f"    upstream: {p['upstream']}")
