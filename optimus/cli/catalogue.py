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
    """Print every pattern: name, stage (pre-grad: the Dynamo graph; post-grad: the ATen
    graphs), kind, the pass it is in, source; description, preconditions and the upstream
    pass it mirrors."""
    from optimus_lens.passes import default_pipeline, pass_catalogue
    from optimus_lens.passes.post_grad import post_grad_pipeline

    in_pass = {}
    for pipe, what in ((default_pipeline(), ""), (post_grad_pipeline(), "post-grad ")):
        for q in pipe.passes:
            off = " (off by default)" if q.name in pipe.disabled else ""
            in_pass.update({p.name: f"in {what}pass {q.name}{off}" for p in q.patterns})
    for p in pass_catalogue():
        where = in_pass.get(p["name"], "not in the default pipeline (upstream_pipeline options only)")
        print(f"{p['name']}  [{p['stage']} {p['kind']} pattern, {where}]  {p['source']}")
        print(f"    {p['description']}")
        for c in p["preconditions"]:
            print(f"    - {c}")
        if p["upstream"]:
            print(f"    upstream: {p['upstream']}")
    return EXIT_OK
