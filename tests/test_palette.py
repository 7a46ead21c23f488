"""The presentation palette survives colour blindness: every pair of mark colours stays
apart under simulated deuteranopia, protanopia and tritanopia."""

from __future__ import annotations

import itertools

import pytest

from optimus_lens.viz.palette import MIN_CVD_DELTA, PRESENTATION, STANDARD, Palette

colorspacious = pytest.importorskip("colorspacious")
DEFICIENCIES = ("deuteranomaly", "protanomaly", "tritanomaly")  # at severity 100: -opia


def _rgb(hex_colour: str) -> list[float]:
    h = hex_colour.lstrip("#")
    return [int(h[i : i + 2], 16) / 255 for i in (0, 2, 4)]


def closest_pair(palette: Palette) -> tuple[float, str, str, str]:
    """(CAM02-UCS ΔE', deficiency, mark, mark) of the two mark colours that come closest
    under any of the simulated deficiencies (Machado et al. 2009, severity 100)."""
    marks = palette.marks()
    out = []
    for cvd in DEFICIENCIES:
        space = {"name": "sRGB1+CVD", "cvd_type": cvd, "severity": 100}
        sim = {k: colorspacious.cspace_convert(_rgb(v), space, "sRGB1").clip(0, 1) for k, v in marks.items()}
        for a, b in itertools.combinations(marks, 2):
            out.append((float(colorspacious.deltaE(sim[a], sim[b], input_space="sRGB1")), cvd, a, b))
    return min(out)


def test_presentation_palette_keeps_every_mark_pair_apart_under_colour_blindness():
    delta, cvd, a, b = closest_pair(PRESENTATION)
    assert delta >= MIN_CVD_DELTA, f"{a} and {b} are {delta:.1f} apart under {cvd}"


def test_the_check_tells_the_standard_red_green_palette_apart():
    delta, cvd, a, b = closest_pair(STANDARD)
    assert delta < MIN_CVD_DELTA and cvd in DEFICIENCIES  # the everyday palette is not colour-blind safe


OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"}


def test_presentation_marks_are_okabe_ito_colours():
    assert set(PRESENTATION.marks().values()) <= OKABE_ITO
