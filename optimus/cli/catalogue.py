"""``optimus samples`` and ``optimus passes``: what there is to run."""

from __future__ import annotations

import argparse

from optimus_lens.cli.errors import EXIT_OK
from optimus_lens.cli.text import samples_text


def add_parsers(sub) -> None:
    """Add ``samples`` and ``passes`` to the subcommands ``sub``."""
    sub.add_parser("samples", help="list the sample models (MODEL sample:NAME)").set_defaults(fn=cmd_samples)
    sub.add_parser("passes", help="list the patterns with description, preconditions and source").set_defaults(
        fn=cmd_passes
    )


def cmd_samples(a: argparse.Namespace) -> int:
    """Print the sample models and the HF architectures."""
    print(samples_text())
    return EXIT_OK


def cmd_passes(a: argparse.Namespace) -> int:
    """Print every pattern: name, kind, the pass it is in, source; description,
    preconditions and the upstream pass it mirrors."""
    from optimus_lens.passes import default_pipeline, pass_catalogue

    pipe = default_pipeline()
    in_pass = {p.name: q.name for q in pipe.passes for p in q.patterns}
    for p in pass_catalogue():
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
    return EXIT_OK
