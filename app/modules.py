"""Folded modules in the step viewer: which modules the user opened, kept in
``st.session_state["unfolded_modules"]`` (a set of module paths such as ``towers.3``)
across steps, and the control that opens and closes them. A click on a folded module's
node (SVG ``<title>`` ``mod:<path>``, ``class="lens-module"``) opens it through
:func:`unfold_clicked`."""

from __future__ import annotations

from collections.abc import MutableMapping

import streamlit as st

from optimus_lens import viz

KEY = "unfolded_modules"
MODES = {"auto": None, "on": True, "off": False}


def unfolded(state: MutableMapping, model: str | None) -> frozenset[str]:
    """The module paths the user opened for ``model`` (forgotten when another model is shown)."""
    if state.get("_unfolded_model") != model:
        state["_unfolded_model"], state[KEY] = model, set()
    return frozenset(state.setdefault(KEY, set()))


def unfold_clicked(state: MutableMapping, node_id: str | None) -> bool:
    """Open the module whose node was clicked (``mod:<path>``); False (nothing changes) for
    any other node."""
    path = viz.module_path(node_id or "")
    if path is None:
        return False
    state[KEY] = set(state.get(KEY, set())) | {path}
    return True


def _sync(state: MutableMapping) -> None:
    state[KEY] = set(state["unfold_pick"])


def _unfold_all(state: MutableMapping) -> None:
    state["fold_modules"] = "off"


def _fold_again(state: MutableMapping) -> None:
    state[KEY], state["fold_modules"] = set(), "auto"


def module_control(state: MutableMapping, folded: list[str]) -> None:
    """A row under the graphs: the modules drawn folded and those opened (ticked), to
    open or close each, "Unfold all" (module folding off) and "Fold again"."""
    opened = set(state.get(KEY, set()))
    if not folded and not opened and state.get("fold_modules", "auto") != "off":
        return
    c = st.columns([6, 1.2, 1.2], vertical_alignment="bottom")
    state["unfold_pick"] = sorted(opened)
    c[0].multiselect(
        f"Unfolded modules ({len(folded)} drawn folded; click one in the graph or pick it here)",
        sorted(set(folded) | opened),
        key="unfold_pick",
        on_change=_sync,
        args=(state,),
        placeholder="pick a folded module to open it",
    )
    c[1].button(
        "Unfold all",
        key="unfold_all",
        on_click=_unfold_all,
        args=(state,),
        width="stretch",
        help="Turn module folding off (View options → Fold modules).",
    )
    c[2].button(
        "Fold again",
        key="fold_again",
        on_click=_fold_again,
        args=(state,),
        width="stretch",
        help="Close every opened module; folding back to auto.",
    )
