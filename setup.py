"""The import package ``optimus_lens`` from the repository's top-level folders.

``optimus/`` is the core (``optimus_lens``); ``app/``, ``viz/`` and ``sample_models/`` are
``optimus_lens.app``, ``optimus_lens.viz`` and ``optimus_lens.sample_models``. Every folder with
an ``__init__.py`` below them is a package, so a new one needs no edit here. Everything else
about the distribution is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

ROOTS = {
    "optimus_lens": "optimus",
    "optimus_lens.app": "app",
    "optimus_lens.viz": "viz",
    "optimus_lens.sample_models": "sample_models",
}


def packages() -> list[str]:
    here = Path(__file__).resolve().parent
    out = []
    for name, folder in ROOTS.items():
        root = here / folder
        for init in sorted(root.rglob("__init__.py")):
            rel = init.parent.relative_to(root).parts
            if "__pycache__" not in rel:
                out.append(".".join((name, *rel)))
    return out


setup(packages=packages(), package_dir=ROOTS)
