"""What a drawn node says: its label lines (name, op and target, shape and dtype, folded
parameters, "×k"), its hover text, the constant arguments a rewrite changed in place, and
the size of its box (for laying a drawing out before Graphviz has drawn it).

Labels are built from a NodeRecord's fields, never by parsing display text. Text that
goes into DOT goes through :func:`dot_text` (and into an HTML-like label through
:func:`html_text`), so a user's names cannot break the DOT syntax.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from optimus_lens.core.trace import NodeRecord, arg_text
from optimus_lens.viz.fold import MODULE_OP
from optimus_lens.viz.palette import STANDARD, Palette

if TYPE_CHECKING:
    from optimus_lens.viz.select import Drawn

_DTYPE_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int64": "i64",
    "int32": "i32",
    "int8": "i8",
    "uint8": "u8",
    "bool": "bool",
}
_NUMBERED = re.compile(r"(.*?)(\d+)")


def shape_text(shape) -> str:
    """``[32, 16]`` -> ``32×16``; ``[]`` -> ``scalar``; a list of equal shapes -> ``8×(32×16)``."""
    if shape is None:
        return ""
    if not shape:
        return "scalar"
    if all(isinstance(s, list) for s in shape):
        parts = [shape_text(s) for s in shape]
        if len(set(parts)) == 1:
            return f"{len(parts)}×({parts[0]})"
        return "(" + ", ".join(parts[:3]) + (", …" if len(parts) > 3 else "") + ")"
    return "×".join(str(d) for d in shape)


def display_name(rec: NodeRecord) -> str:
    """A placeholder's readable name: Dynamo's ``l_self_modules_towers_modules_0_modules_fc1_parameters_weight_``
    -> ``towers.0.fc1.weight``; ``l_x_`` -> ``x``; other nodes keep their name."""
    name = rec.name
    if rec.op != "placeholder":
        return name
    m = re.fullmatch(r"l_(?:self_)?(.*?)_?", name)
    if not m:
        return name
    core = m.group(1)
    core = re.sub(r"^modules_", "", core)
    core = re.sub(r"_(?:modules|parameters|buffers)_", ".", core)
    return core or name


def dot_text(text: str) -> str:
    """Text for a DOT label or tooltip: backslashes doubled, so only our own ``\\n`` are escapes."""
    return str(text).replace("\\", "\\\\")


def html_text(text: str) -> str:
    """Text for an HTML-like DOT label: ``&``, ``<`` and ``>`` escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def label_lines(rec: NodeRecord, folded: int = 0, count: int = 1) -> list[str]:
    """The label's lines, built from the record's fields (never by parsing display text):
    name; op and short target (getitem: its index); shape and dtype; ``+N params`` when
    parameters were folded into this node; ``×k parallel`` for a folded class."""
    sd = " ".join(x for x in (shape_text(rec.shape), _DTYPE_SHORT.get(rec.dtype or "", rec.dtype or "")) if x)
    if rec.op == "placeholder":
        lines = [display_name(rec), sd]
    elif rec.op == MODULE_OP:
        size = f"{rec.args[0]} nodes" if rec.args else ""
        lines = [rec.module, f"{rec.module_type} · {size}" if rec.module_type else size, sd]
    elif rec.op == "output":
        lines = ["output"]
    elif rec.op == "get_attr":
        lines = [rec.target, sd]
    else:
        t = rec.short_target
        if rec.op == "call_method":
            t = f".{t}()"
        elif rec.op == "call_module":
            t = f"{rec.target} ({rec.module_type or 'module'})"
        if t == "getitem" and len(rec.args) >= 2:
            t = f"getitem [{_cut(arg_text(rec.args[1]), 18)}]"
        redundant = re.fullmatch(re.escape(t) + r"(_\d+)?", rec.name)  # linear_3 is a linear
        lines = [rec.name, sd] if redundant else [rec.name, t, sd]
    if folded:
        lines.append(f"+{folded} param{'s' if folded > 1 else ''}")
    if count > 1:
        lines[0] = f"{lines[0]} … ×{count}"
    return [x for x in lines if x]


def node_label(rec: NodeRecord, folded: int = 0, count: int = 1) -> str:
    """Label text (DOT ``\\n``-joined lines of :func:`label_lines`)."""
    return "\\n".join(dot_text(x) for x in label_lines(rec, folded, count))


def arg_changes(old: NodeRecord, new: NodeRecord) -> list[tuple[str, str, str]]:
    """Constant arguments a rewrite changed in place: ``(where, old text, new text)`` for
    each positional argument (``args[i]``) or keyword whose value differs and holds no
    node reference (a changed node reference is a rewiring, marked separately).
    ``normalize_split`` turning ``split(x, 16)`` into ``split(x, [16, 16, 16])`` gives
    ``[("args[1]", "16", "[16, 16, 16]")]``."""
    out = []
    for i in range(max(len(old.args), len(new.args))):
        a = old.args[i] if i < len(old.args) else None
        b = new.args[i] if i < len(new.args) else None
        if a != b and not _has_ref(a) and not _has_ref(b):
            out.append(
                (f"args[{i}]", "—" if i >= len(old.args) else arg_text(a), "—" if i >= len(new.args) else arg_text(b))
            )
    for k in dict.fromkeys([*old.kwargs, *new.kwargs]):
        a, b = old.kwargs.get(k), new.kwargs.get(k)
        if a != b and not _has_ref(a) and not _has_ref(b):
            out.append((k, "—" if k not in old.kwargs else arg_text(a), "—" if k not in new.kwargs else arg_text(b)))
    return out


def _has_ref(a) -> bool:
    if isinstance(a, dict):
        return ("node" in a and len(a) == 1) or any(_has_ref(v) for v in a.values())
    if isinstance(a, list):
        return any(_has_ref(v) for v in a)
    return False


def html_label(lines: list[str], changes: list[tuple[str, str, str]], palette: Palette = STANDARD) -> str:
    """An HTML-like label: the plain lines, then one line per changed argument with the
    old value struck through (red) and the new one beside it (green; the palette's)."""
    rows = [html_text(x) for x in lines]
    for where, old, new in changes:
        rows.append(
            f'{html_text(where)}: <FONT COLOR="{palette.changed_old}"><S>{html_text(_cut(old, 24))}</S></FONT> '
            f'<FONT COLOR="{palette.changed_new}">{html_text(_cut(new, 24))}</FONT>'
        )
    return "<" + "<BR/>".join(rows) + ">"


def node_tooltip(rec: NodeRecord, members: list[str] | None = None) -> str:
    """Hover text: name, op, full target and arguments, module and source line; for a
    folded class, how many parallel copies it stands for and their names."""
    if rec.op == MODULE_OP:
        lines = [
            f"module {rec.module}"
            + (f" ({rec.module_type})" if rec.module_type else "")
            + f": {rec.args[0]} nodes folded into this node"
        ]
    else:
        lines = [f"{rec.name}  ({rec.op})", f"{rec.target}({rec.args_text(200)})"]
    if members:
        lines.insert(0, f"×{len(members)} parallel copies: {_ranges(tuple(members))}")
    if rec.module and rec.op != MODULE_OP:
        lines.append(f"module: {rec.module}" + (f" ({rec.module_type})" if rec.module_type else ""))
    if rec.source:
        lines.append(_cut(rec.source, 300))  # generated code can put thousands of characters on one line
    return "\\n".join(dot_text(x) for x in lines)


@functools.lru_cache(maxsize=256)
def _ranges(names: tuple[str, ...]) -> str:
    return name_ranges(names)


def name_ranges(names) -> str:
    """Every name, numbered runs compressed: ``linear, linear_1, …, linear_127, relu_3`` ->
    ``linear, linear_1…linear_127, relu_3`` (so a folded class of 128 accounts for all
    members in one line)."""
    out: list[str] = []
    run: list[tuple[str, int, str]] = []

    def flush():
        if len(run) > 2:
            out.append(f"{run[0][2]}…{run[-1][2]}")
        else:
            out.extend(r[2] for r in run)
        run.clear()

    for n in names:
        m = _NUMBERED.fullmatch(n)
        if m and run and m.group(1) == run[-1][0] and int(m.group(2)) == run[-1][1] + 1:
            run.append((m.group(1), int(m.group(2)), n))
            continue
        flush()
        if m:
            run.append((m.group(1), int(m.group(2)), n))
        else:
            out.append(n)
    flush()
    return ", ".join(out)


# --------------------------------------------------------------------------- box sizes


def label_size(label: str) -> tuple[float, float]:
    """Estimated (width, height) in inches of a 10 pt Helvetica box label (plain or HTML)."""
    text = re.sub(r"<[^>]+>", "\n", label.replace("<BR/>", "\n")).replace("\\n", "\n")
    lines = [x for x in text.split("\n") if x.strip()] or [""]
    return max(0.6, 0.075 * max(len(x) for x in lines) + 0.2), 0.17 * len(lines) + 0.12


#: per-record memo of box sizes, keyed by the record's identity and what its label shows (the
#: record is held beside its size, so its id is not reused while cached)
_SIZES: dict[tuple, tuple[NodeRecord, tuple[float, float]]] = {}
_SIZES_MAX = 100_000


def box_sizes(d: Drawn, changes: dict[str, list[tuple[str, str, str]]]) -> dict[str, tuple[float, float]]:
    """Estimated (width, height) in inches of each drawn node's box in ``d``, its label
    including the changed arguments in ``changes`` (node -> :func:`arg_changes`): what a
    layout computed before drawing (:func:`optimus_lens.viz.layout.bounded_layout`) sizes nodes by."""
    out = {}
    if len(_SIZES) > _SIZES_MAX:
        _SIZES.clear()
    for n in d.order:
        rec, params, count, ch = d.recs[n], d.params.get(n, 0), d.count(n), changes.get(n, [])
        key = (id(rec), params, count, tuple(ch))
        hit = _SIZES.get(key)
        if hit is None or hit[0] is not rec:
            lines = label_lines(rec, params, count) + [f"{w}: {o} {nw}" for w, o, nw in ch]
            hit = _SIZES[key] = (rec, label_size("\n".join(lines)))
        out[n] = hit[1]
    return out
