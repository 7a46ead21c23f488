"""Split / cat / stack / unbind cleanups: the identity pairs batch fusions leave, and
upstream's split/cat pattern passes in our form (torch/_inductor/fx_passes/split_cat.py).

One job per module:

* :mod:`.analysis` — reading split/unbind/cat/stack nodes from their example values
  (:class:`Parts`, :class:`Run`, :func:`segments`) and why a site must be left alone
  (:func:`mutation_miss`, :func:`layout_miss`);
* :mod:`.build` — building replacements through the Rewriter (:func:`as_block`,
  :func:`rebuild`, :func:`swap`);
* :mod:`.identities` — the identities as rules of the match language
  (``remove_unbind_stack``, ``remove_stack_unbind``, ``remove_split_cat``,
  ``remove_cat_split``, ``remove_split_with_size_one``);
* :mod:`.merge` — ``merge_splits``, ``merge_getitem_cat``, ``mutate_cat``;
* :mod:`.simplify` — ``simplify_split_cat``, ``merge_split_squeeze`` (``split_cat_pass``) and
  ``merge_unbind_stack`` (``unbind_stack_pass``);
* :mod:`.to_slices` — the threshold passes (``split_cat_to_slices`` ..
  ``move_reshape_out_of_split_stack``).

Importing the package registers every pattern. Unlike upstream the patterns read section
sizes and dims from example values, so they do not need ``normalization_pass`` to have
run, and they refuse any site whose values (or values aliasing them) are written in place.
"""

from __future__ import annotations

from optimus_lens.passes.split_cat import identities, merge, simplify, to_slices  # noqa: F401  (registration)
from optimus_lens.passes.split_cat.analysis import (  # noqa: F401
    Parts,
    Run,
    block_ok,
    cat_args,
    cat_stack_layouts,
    computed_size,
    getitem_piece,
    getitem_users,
    layout_miss,
    mutation_miss,
    parts_of,
    piece_index,
    segments,
    single_run,
    split_parts,
    unbind_parts,
)
from optimus_lens.passes.split_cat.build import (  # noqa: F401
    as_block,
    carry_meta,
    erase_if_unused,
    getitems_of,
    movedim,
    rebuild,
    swap,
)
