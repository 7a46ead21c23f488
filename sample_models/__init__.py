"""Optimus Lens sample models: a registry of demo, teaching and realistic models
with example inputs.

    from optimus_lens.sample_models import REGISTRY, get, names, SampleModel
    model, inputs = get("recsys_towers")
    out = model(*inputs)

Every ``build()`` is deterministic, returns a float32 CPU model in eval mode
plus a tuple of example inputs, and the model traces with
``torch.compile(..., fullgraph=True)``. ``names()[0]`` (``DEFAULT``) is the
default model. The realistic models (``bert``, ``gpt2``) need ``transformers``
(``pip install -e .[models]``), imported only when they are built.
"""

# ruff: noqa: I001 - the imports below register the models, in this order (REGISTRY's order)
from ._registry import KINDS, REGISTRY, SampleModel, get, get_entry, names, register

# importing these modules registers their models, in this order
from . import demo as _demo  # noqa: E402,F401
from . import teaching as _teaching  # noqa: E402,F401
from . import teaching_split_cat as _teaching_split_cat  # noqa: E402,F401
from . import teaching_batch as _teaching_batch  # noqa: E402,F401
from . import teaching_identities as _teaching_identities  # noqa: E402,F401
from . import realistic as _realistic  # noqa: E402,F401
from . import perf as _perf  # noqa: E402,F401
from . import recsys_real as _recsys_real  # noqa: E402,F401
from . import industrial as _industrial  # noqa: E402,F401
from . import lab as _lab  # noqa: E402,F401
from . import post_grad as _post_grad  # noqa: E402,F401

#: the default model shown first
DEFAULT = "recsys_towers"

__all__ = ["SampleModel", "REGISTRY", "KINDS", "DEFAULT", "get", "get_entry", "names", "register"]
