"""Colours of the step pictures' marks, as named palettes.

``standard`` is the app's everyday palette. ``okabe-ito`` is for presentation mode: the
eight colours of Okabe & Ito, "Color Universal Design" (2002), chosen to stay apart under
the common colour-vision deficiencies, with darker edges for a washed-out projector.
``tests/test_palette.py`` checks that every pair of its mark colours stays at least
:data:`MIN_CVD_DELTA` apart (CAM02-UCS ΔE, ``colorspacious``) under simulated
deuteranopia, protanopia and tritanopia (Machado et al. 2009 at severity 100)."""

from __future__ import annotations

from dataclasses import dataclass

#: the smallest CAM02-UCS colour difference (ΔE') allowed between two mark colours of a
#: colour-blind-safe palette under each simulated deficiency; ~1-2 is just noticeable, and
#: the standard palette's created (green) and erased (red) borders fall to 7 under deuteranopia
MIN_CVD_DELTA = 15.0


@dataclass(frozen=True)
class Palette:
    """Fills, borders and line colours of one palette (hex ``#rrggbb``).

    ``groups``: fills of pattern sites, one per fused group (cycled); ``created_*``:
    nodes a step added; ``erased_border``: nodes it removed (dashed); ``rewired_border``:
    nodes whose inputs it changed; ``ghost_*``: erased nodes in the diff view;
    ``provenance``: the dashed replaced-by arrow; ``changed_old``/``changed_new``: an
    argument changed in place, struck through / new; ``module_*``: a folded module;
    ``edge``: ordinary edges; ``border``: ordinary node borders."""

    name: str
    groups: tuple[str, ...]
    created_fill: str
    created_border: str
    erased_border: str
    rewired_border: str
    ghost_fill: str
    ghost_text: str
    provenance: str
    changed_old: str
    changed_new: str
    module_fill: str
    module_border: str
    edge: str = "#666666"
    border: str = "#777777"

    def marks(self) -> dict[str, str]:
        """The colours that tell a step's marks apart, by mark name (what the colour-blindness
        check compares; a folded module is told apart by its shape, not its colour)."""
        return {
            "site": self.groups[0],
            "created": self.created_border,
            "created fill": self.created_fill,
            "erased": self.erased_border,
            "rewired": self.rewired_border,
            "replaced-by arrow": self.provenance,
        }


STANDARD = Palette(
    name="standard",
    groups=(
        "#ffd54f",
        "#81d4fa",
        "#ce93d8",
        "#ffab91",
        "#f48fb1",
        "#80cbc4",
        "#e6ee9c",
        "#b39ddb",
        "#ffcc80",
        "#90caf9",
    ),
    created_fill="#c8e6c9",
    created_border="#2e7d32",
    erased_border="#c62828",
    rewired_border="#1565c0",
    ghost_fill="#f5f5f5",
    ghost_text="#9e9e9e",
    provenance="#6a1b9a",
    changed_old="#c62828",
    changed_new="#2e7d32",
    module_fill="#ede7f6",
    module_border="#5e35b1",
)

#: Okabe-Ito: orange E69F00, sky blue 56B4E9, bluish green 009E73, yellow F0E442, blue 0072B2,
#: vermillion D55E00, reddish purple CC79A7, black 000000
OKABE_ITO = Palette(
    name="okabe-ito",
    groups=("#F0E442", "#CC79A7", "#56B4E9", "#E69F00", "#009E73"),
    created_fill="#56B4E9",
    created_border="#0072B2",
    erased_border="#D55E00",
    rewired_border="#E69F00",
    ghost_fill="#eeeeee",
    ghost_text="#555555",
    provenance="#000000",
    changed_old="#D55E00",
    changed_new="#000000",
    module_fill="#e0e0e0",
    module_border="#000000",
    edge="#222222",
    border="#333333",
)

PALETTES = {p.name: p for p in (STANDARD, OKABE_ITO)}
#: the palette of presentation mode
PRESENTATION = OKABE_ITO
