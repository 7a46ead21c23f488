"""Presentation mode: one switch, kept in ``st.session_state["presentation"]`` (a plain
bool, so every page reads it, the step viewer's and the teaching pages alike), for a
projector and a class: large text, the graphs first and as tall as the window, the
controls out of the way (sidebar hidden, view controls collapsed), the left/right keys
pressing Previous/Next, and the colour-blind-safe palette (:data:`optimus_lens.viz.palette.PRESENTATION`)."""

from __future__ import annotations

from collections.abc import MutableMapping

import streamlit as st

from optimus_lens.viz.palette import PRESENTATION, STANDARD, Palette

KEY = "presentation"  # its first value (False) comes from app.state.init
#: text scale of the graphs in presentation mode: 10 pt labels at 17-25 px
TEXT_SCALE = 1.7

#: hidden in presentation mode: the sidebar, Streamlit's header, the view-controls bar and the
#: debugging tools above the graphs; the page text grows and the graph fills the window
_CSS = """<style>
section[data-testid='stSidebar'], [data-testid='stSidebarCollapsedControl'], header[data-testid='stHeader'],
.st-key-lens_viewbar, .st-key-lens_tools {display:none !important}
html {font-size: 19px}
.block-container {padding-top: 0.4rem !important}
.block-container [data-testid='stVerticalBlock'] {gap: 0.35rem}
.stElementContainer:has(> .stHtml), .stElementContainer:has(style) {display: none}
</style>"""

#: the left/right arrow keys press the step viewer's Previous/Next buttons (not while a text
#: field, list or slider has the focus); keys pressed in the step view (the click component)
#: bubble up to the page, and the report's viewer in an iframe forwards them here
_KEYS = """<script>
(function(){
  if (window.lensStepKeys) return;
  window.lensStepKeys = function(key){
    const b = document.querySelector(key === 'ArrowRight' ? '.st-key-next button' : '.st-key-prev button');
    if (b && !b.disabled) { b.click(); return true; }
    return false;
  };
  document.addEventListener('keydown', function(e){
    if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight') return;
    const t = e.target;
    if (t && t.closest && t.closest('input, textarea, select, [role=slider], [role=combobox], [role=listbox], [contenteditable=true]')) return;
    if (window.lensStepKeys(e.key)) e.preventDefault();
  });
})();
</script>"""


def is_on(state: MutableMapping) -> bool:
    return bool(state.get(KEY, False))


def palette(state: MutableMapping) -> Palette:
    """The marks' palette: colour-blind safe in presentation mode."""
    return PRESENTATION if is_on(state) else STANDARD


def _sync(state: MutableMapping, widget_key: str) -> None:
    state[KEY] = bool(state[widget_key])


def switch(state: MutableMapping, where=st, widget_key: str = "presentation_switch") -> None:
    """The switch, as a toggle in ``where`` bound to ``state["presentation"]`` (each place
    that shows one passes its own ``widget_key``)."""
    state[widget_key] = is_on(state)
    where.toggle(
        "Presentation",
        key=widget_key,
        on_change=_sync,
        args=(state, widget_key),
        help="For a projector: large text, graphs first and as tall as the window, controls hidden, "
        "←/→ keys for Previous/Next, a colour-blind-safe palette (Okabe–Ito).",
    )


def apply(state: MutableMapping) -> None:
    """The page styling of presentation mode (when on) and the arrow-key navigation."""
    if is_on(state):
        st.html(_CSS)
    st.html(_KEYS, unsafe_allow_javascript=True)
