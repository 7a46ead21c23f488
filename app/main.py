"""Optimus Lens — step through Optimus graph passes in the browser (``optimus app``).

The router: page setup, the session state's first values (:func:`optimus_lens.app.state.init`,
the one place), and the pages in the sidebar's navigation (``st.navigation``) — the step
viewer (:mod:`optimus_lens.app.step_viewer`), the Pattern Lab (:mod:`optimus_lens.app.lab`),
Teach (:mod:`optimus_lens.app.teach`) and Sweep (:mod:`optimus_lens.app.sweep_view`). The
step viewer opens first; Sweep does when the app was started on a sweep directory
(``optimus app --sweep DIR`` sets ``OPTIMUS_LENS_SWEEP``).

``st.session_state["page_choice"]`` names the page on screen after every run; a button
callback moves to another page with :func:`optimus_lens.app.state.go_to` (it sets
``page_choice``), and the next run shows that page.
"""

from __future__ import annotations

import os

import streamlit as st

from optimus_lens.app import state as S


def _viewer() -> None:
    from optimus_lens.app import step_viewer

    step_viewer.page()


def _lab() -> None:
    from optimus_lens.app import lab

    with st.sidebar:
        st.title("Optimus Lens")
        st.caption("Pattern Lab: write a pattern, preview its matches, apply it as a pass.")
    lab.page()


def _teach() -> None:
    from optimus_lens.app import teach

    with st.sidebar:
        st.title("Optimus Lens")
        st.caption("Teach: a guided walk through one pattern on its teaching model.")
    teach.page()


def _sweep() -> None:
    from optimus_lens.app import sweep_view

    sweep_view.page()


def pages() -> dict[str, st.Page]:
    """The pages by title, in the navigation's order (:data:`optimus_lens.app.state.PAGES`); the
    default one, shown at the app's root URL, is Sweep when the app was started on a sweep
    directory, else the step viewer."""
    default = S.SWEEP if os.environ.get(S.SWEEP_ENV) else S.VIEWER
    run = {S.VIEWER: _viewer, S.LAB: _lab, S.TEACH: _teach, S.SWEEP: _sweep}
    paths = {S.VIEWER: "viewer", S.LAB: "lab", S.TEACH: "teach", S.SWEEP: "sweep"}
    return {t: st.Page(run[t], title=t, url_path=paths[t], default=t == default) for t in S.PAGES}


def main() -> None:
    """One run of the app: page setup, the shared state's first values, the page on screen."""
    st.set_page_config(page_title="Optimus Lens", layout="wide")
    # the step's graphs should start above the fold at 1280x800: less empty space above the page
    st.markdown("<style>.block-container{padding-top:2.2rem;padding-bottom:1rem}</style>", unsafe_allow_html=True)
    ss = st.session_state
    S.init(ss)
    by_title = pages()
    nav = st.navigation(list(by_title.values()))
    asked = ss.get(S.PAGE)  # changed since the last run (go_to): that page, else the one picked
    if asked in by_title and asked != ss.get(S.PAGE_SHOWN) and asked != nav.title:
        st.switch_page(by_title[asked])  # ends this run; the next one draws that page
    ss[S.PAGE] = ss[S.PAGE_SHOWN] = nav.title
    nav.run()


if __name__ == "__main__":  # Streamlit runs this file as __main__; a spawned worker's re-import does not draw
    main()
