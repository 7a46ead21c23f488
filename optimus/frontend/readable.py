"""FX's readable code back into a GraphModule: the graphs of a compile log.

PyTorch logs every graph it compiles as the code ``GraphModule.print_readable`` writes
(``torch/fx/graph.py``, ``CodeGen._gen_python_code`` with ``verbose=True``): one
statement per FX node, ``name: "f32[4, 16][16, 1]cpu" = torch._C._nn.linear(x, w, b)``,
with the node's dtype, shape, strides and device in the annotation and the user's
source line in the ``# File: path:line in fn, code: text`` comment above it. Dynamo's
graphs (``dynamo_output_graph``, ``before_pre_grad_graph``) are in torch IR; the AOT
graphs (``aot_forward_graph``, ``before_post_grad_graph``) in ATen IR.

:func:`graph_from_code` reads that code with :mod:`ast` and builds the same graph node
for node: the same names (placeholders ``l_x_`` for the argument ``L_x_``), the same
ops (``e + x`` is ``operator.add``, ``x.sum(1)`` a ``call_method``, ``self.sub`` a
``get_attr``), nested ``class`` bodies as submodules (higher-order ops' subgraphs),
``# File:`` comments as each node's ``stack_trace``, and each node's annotation text in
``meta["logged"]``. It never runs the code. Raises :class:`ReadableCodeError` naming the
line for a statement FX does not write or a name it cannot resolve.
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
import re
import sys
from dataclasses import dataclass

import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils._dtype_abbrs import dtype_abbrs

#: annotation text -> dtype (``f32`` -> torch.float32), inverse of FX's table
DTYPES = {v: k for k, v in dtype_abbrs.items()}

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.MatMult: operator.matmul,
}
_INPLACE = {
    ast.Add: operator.iadd,
    ast.Sub: operator.isub,
    ast.Mult: operator.imul,
    ast.Div: operator.itruediv,
    ast.FloorDiv: operator.ifloordiv,
    ast.Mod: operator.imod,
    ast.Pow: operator.ipow,
    ast.LShift: operator.ilshift,
    ast.RShift: operator.irshift,
    ast.BitAnd: operator.iand,
    ast.BitOr: operator.ior,
    ast.BitXor: operator.ixor,
    ast.MatMult: operator.imatmul,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
#: the names FX's generated code may use without importing them (``torch/fx/graph.py``'s
#: custom builtins)
_GLOBALS = {
    "inf": math.inf,
    "nan": math.nan,
    "NoneType": type(None),
    "torch": torch,
    "device": torch.device,
    "operator": operator,
    "math": math,
}
#: calls FX writes inside an argument: constants, evaluated here
_CONSTANT_CALLS = {slice, torch.device, torch.Size}
_FILE_COMMENT = re.compile(r"^\s*# File: (.+):(\d+) in (.+?), code: (.*)$")
_NO_STACK = "No stacktrace found for following nodes"
_ANNOTATION = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](?:\[([^\]]*)\])?([a-z][a-z0-9:]*)?")


class ReadableCodeError(ValueError):
    """Readable graph code this reader cannot turn back into a graph (the message names
    the line and the reason)."""


@dataclass(frozen=True)
class LoggedMeta:
    """A node's annotation in readable code, parsed: ``f32[s0, 16][16, 1]cuda:0`` is
    dtype float32, sizes ``("s0", "16")`` and strides ``("16", "1")`` (expression texts:
    symbolic sizes stay symbols), device ``cuda:0``; ``Sym(s0)`` is ``sym="s0"`` (a SymInt
    node). ``wrapper`` names a tensor subclass the annotation wraps (``DTensor``)."""

    dtype: torch.dtype | None = None
    shape: tuple[str, ...] = ()
    stride: tuple[str, ...] | None = None
    device: str | None = None
    sym: str | None = None
    wrapper: str | None = None


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses (``Max(1, s0), 16`` -> two parts)."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last or out:
        out.append(last)
    return [p for p in out if p]


def parse_annotation(text: str | None) -> LoggedMeta | None:
    """A readable-code annotation (``f32[4, 16][16, 1]cpu``, ``Sym(s0)``,
    ``DTensor(f32[8][1]cuda:0, S(0))``) as :class:`LoggedMeta`; None when there is none
    or it names no dtype this torch knows."""
    if not text:
        return None
    text = text.strip()
    if text.startswith("Sym(") and text.endswith(")"):
        return LoggedMeta(sym=text[4:-1])
    wrapper = None
    m = re.match(r"^([A-Za-z_]\w*)\((.*)\)$", text)
    if m and m.group(1) not in DTYPES:
        wrapper, text = m.group(1), m.group(2)
    m = _ANNOTATION.match(text)
    if not m or m.group(1) not in DTYPES:
        return None
    stride = tuple(split_top(m.group(3))) if m.group(3) is not None else None
    return LoggedMeta(DTYPES[m.group(1)], tuple(split_top(m.group(2))), stride, m.group(4) or None, None, wrapper)


def _stack_comments(code: str) -> dict[int, str | None]:
    """line number -> the FX ``stack_trace`` the ``# File:`` comment above it gives (None
    under "No stacktrace found"), for every line after such a comment."""
    out: dict[int, str | None] = {}
    cur: str | None = None
    for i, line in enumerate(code.splitlines(), 1):
        m = _FILE_COMMENT.match(line)
        if m:
            file, lineno, fn, text = m.groups()
            cur = f'  File "{file}", line {lineno}, in {fn}\n    {text.strip()}\n'
        elif _NO_STACK in line:
            cur = None
        out[i] = cur
    return out


_MODULE_NAMES: dict[str, object] = {}


def _sanitized(name: str):
    """The object FX wrote as a sanitized global (``math_sqrt`` for ``math.sqrt``): a loaded
    module whose name, dots as underscores, begins ``name``, holding the rest as an
    attribute; None when none does."""
    if not _MODULE_NAMES or len(_MODULE_NAMES) != len(sys.modules):
        _MODULE_NAMES.clear()
        _MODULE_NAMES.update({m.replace(".", "_"): mod for m, mod in list(sys.modules.items()) if mod is not None})
    base = re.sub(r"_\d+$", "", name)  # FX's namespace adds _1, _2 to a repeated global
    for i in range(len(base) - 1, 0, -1):
        if base[i] == "_" and base[:i] in _MODULE_NAMES:
            obj = getattr(_MODULE_NAMES[base[:i]], base[i + 1 :], None)
            if obj is not None:
                return obj
    return None


def resolve_global(dotted: str):
    """The object a global name of generated code stands for: ``torch._C._nn.linear``,
    ``operator.getitem``, ``getattr``, ``inf``, ``device``, or a sanitized name FX wrote for
    a function outside torch (``math_sqrt``). Raises KeyError when nothing matches."""
    head, *rest = dotted.split(".")
    if head in _GLOBALS:
        obj = _GLOBALS[head]
    elif hasattr(builtins, head):
        obj = getattr(builtins, head)
    elif head == "_operator":
        obj = operator
    elif head in ("fx_pytree", "pytree"):
        import torch.fx._pytree as fx_pytree
        import torch.utils._pytree as pytree

        obj = fx_pytree if head == "fx_pytree" else pytree
    else:
        obj = sys.modules.get(head) or _sanitized(head)
        if obj is None:
            raise KeyError(dotted)
    for part in rest:
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise KeyError(dotted) from e
    return obj


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr}" if base else None
    return None


def _self_path(expr: ast.expr) -> str | None:
    """``self.a.b`` / ``getattr(self.a, "0").w`` -> ``a.b`` / ``a.0.w``; None when the
    expression is not rooted at ``self``."""
    if isinstance(expr, ast.Attribute):
        if isinstance(expr.value, ast.Name) and expr.value.id == "self":
            return expr.attr
        base = _self_path(expr.value)
        return f"{base}.{expr.attr}" if base else None
    if (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "getattr"
        and len(expr.args) == 2
        and isinstance(expr.args[1], ast.Constant)
    ):
        base = _self_path(expr.args[0])
        return f"{base}.{expr.args[1].value}" if base else None
    return None


def _annotation_text(a: ast.expr | None) -> str | None:
    return a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None


class _Builder:
    """One class body of readable code -> one GraphModule (nested classes: submodules)."""

    def __init__(self, cls: ast.ClassDef, stacks: dict[int, str | None]):
        self.cls, self.stacks = cls, stacks
        self.graph = Graph()
        self.root = torch.nn.Module()
        self.vars: dict[str, Node] = {}
        self.pending: tuple | None = None  # an in-place statement waiting for the name FX gives it next
        self.line = cls.lineno

    def fail(self, why: str) -> ReadableCodeError:
        return ReadableCodeError(f"line {self.line}: {why}")

    def build(self) -> GraphModule:
        forward = None
        for item in self.cls.body:
            if isinstance(item, ast.ClassDef):
                setattr(self.root, item.name, _Builder(item, self.stacks).build())
            elif isinstance(item, ast.FunctionDef) and item.name == "forward":
                forward = item
        if forward is None:
            raise self.fail(f"class {self.cls.name} has no forward")
        self._placeholders(forward)
        for stmt in forward.body:
            self.line = stmt.lineno
            self._statement(stmt)
        self._flush()
        return GraphModule(self.root, self.graph, self.cls.name)

    # ---- placeholders
    def _placeholders(self, fn: ast.FunctionDef) -> None:
        args = [a for a in fn.args.args if a.arg != "self"]
        declared = [s for s in fn.body if isinstance(s, ast.AnnAssign) and s.value is None]
        if declared:  # a joint graph: flat inputs declared in the body, unpacked from pytrees
            specs = [(s.target.id, s.target.id, _annotation_text(s.annotation)) for s in declared]  # type: ignore[union-attr]
        else:
            renames = {
                s.value.id: s.targets[0].id
                for s in fn.body
                if isinstance(s, ast.Assign)
                and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)
                and isinstance(s.value, ast.Name)
            }
            specs = [(a.arg, renames.get(a.arg, a.arg), _annotation_text(a.annotation)) for a in args]
        for target, name, ann in specs:
            node = self.graph.create_node("placeholder", target, name=name)
            if ann:
                node.meta["logged"] = ann
            self.vars[target] = self.vars[name] = node

    # ---- statements
    def _statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, (ast.Expr, ast.Pass)):
            return
        if isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self._define(stmt.target, stmt.value, _annotation_text(stmt.annotation))
            return
        if isinstance(stmt, ast.AugAssign):
            op = _INPLACE.get(type(stmt.op))
            if op is None:
                raise self.fail(f"in-place operator {type(stmt.op).__name__} is not one FX writes")
            self._flush()
            self.pending = (op, (self._arg(stmt.target), self._arg(stmt.value)))
            return
        if isinstance(stmt, ast.Return):
            self._flush()
            value = stmt.value
            if (
                isinstance(value, ast.Call)
                and _dotted(value.func) == "pytree.tree_unflatten"
                and value.args  # a joint graph's outputs, packed into its output pytree
            ):
                value = value.args[0]
            self.graph.output(self._arg(value) if value is not None else None)
            return
        if isinstance(stmt, ast.Assign):
            if isinstance(stmt.value, ast.Constant) and stmt.value.value is None:
                return  # FX frees values after their last use: `a = b = None`
            target = stmt.targets[0]
            if isinstance(target, ast.Tuple):
                if isinstance(stmt.value, ast.Call) and _dotted(stmt.value.func) == "fx_pytree.tree_flatten_spec":
                    return
                raise self.fail("tuple assignment other than the inputs' unpacking")
            if isinstance(target, ast.Subscript):
                self._flush()
                self.pending = (
                    operator.setitem,
                    (self._arg(target.value), self._arg(target.slice), self._arg(stmt.value)),
                )
                return
            if len(stmt.targets) == 1 and isinstance(target, ast.Name) and isinstance(stmt.value, ast.Name):
                if self.pending is not None:  # `x += y;  iadd = x`: the in-place node's name
                    op, args = self.pending
                    self.pending = None
                    self._node(target.id, "call_function", op, args, {}, None)
                    return
                if self.vars.get(stmt.value.id) is not None and self.vars[stmt.value.id].op == "placeholder":
                    return  # `l_x_ = L_x_`: the placeholder's name, already given
            self._define(target, stmt.value, None)
            return
        raise self.fail(f"{type(stmt).__name__} statement: not code FX generates")

    def _flush(self) -> None:
        if self.pending is not None:
            op, args = self.pending
            self.pending = None
            self._node(None, "call_function", op, args, {}, None)

    def _define(self, target: ast.expr, value: ast.expr, ann: str | None) -> None:
        self._flush()
        if not isinstance(target, ast.Name):
            raise self.fail("assignment to something other than a name")
        op, fn, args, kwargs = self._call(value)
        self._node(target.id, op, fn, args, kwargs, ann)

    def _node(self, name: str | None, op: str, target, args, kwargs, ann: str | None) -> Node:
        node = self.graph.create_node(op, target, tuple(args), dict(kwargs), name=name)
        if ann:
            node.meta["logged"] = ann
        stack = self.stacks.get(self.line)
        if stack:
            node.meta["stack_trace"] = stack
        if name is not None and node.name != name:
            raise self.fail(f"{name!r} is defined twice")
        self.vars[node.name] = node
        return node

    def _call(self, e: ast.expr) -> tuple[str, object, list, dict]:
        """(op, target, args, kwargs) of the node the right-hand side ``e`` defines."""
        if isinstance(e, ast.Call):
            args = [self._arg(a) for a in e.args]
            kwargs = {k.arg: self._arg(k.value) for k in e.keywords if k.arg is not None}
            path = _self_path(e.func)
            if path is not None:
                return "call_module", path, args, kwargs
            if isinstance(e.func, ast.Attribute) and isinstance(self._maybe_node(e.func.value), Node):
                return "call_method", e.func.attr, [self._arg(e.func.value), *args], kwargs
            return "call_function", self._global(e.func), args, kwargs
        if isinstance(e, ast.BinOp) and type(e.op) in _BINOPS:
            return "call_function", _BINOPS[type(e.op)], [self._arg(e.left), self._arg(e.right)], {}
        if isinstance(e, ast.UnaryOp):
            return "call_function", _UNARY[type(e.op)], [self._arg(e.operand)], {}
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and type(e.ops[0]) in _COMPARE:
            return "call_function", _COMPARE[type(e.ops[0])], [self._arg(e.left), self._arg(e.comparators[0])], {}
        if isinstance(e, ast.Subscript):
            return "call_function", operator.getitem, [self._arg(e.value), self._arg(e.slice)], {}
        if isinstance(e, ast.Attribute):
            path = _self_path(e)
            if path is not None:
                return "get_attr", path, [], {}
            if isinstance(self._maybe_node(e.value), Node):
                return "call_function", getattr, [self._arg(e.value), e.attr], {}
        raise self.fail(f"cannot read {ast.unparse(e)!r} as an FX node")

    def _maybe_node(self, e: ast.expr):
        return self.vars.get(e.id) if isinstance(e, ast.Name) else None

    def _global(self, e: ast.expr):
        name = _dotted(e)
        if name is None:
            raise self.fail(f"cannot call {ast.unparse(e)!r}")
        try:
            return resolve_global(name)
        except KeyError:
            raise self.fail(
                f"cannot resolve {name!r} (a function of a module this process has not imported?)"
            ) from None

    def _arg(self, e: ast.expr):
        """An argument: a node, a constant, or a list/tuple/dict/slice of them."""
        if isinstance(e, ast.Name):
            if e.id in self.vars:
                return self.vars[e.id]
            return self._global(e)
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.List):
            return [self._arg(x) for x in e.elts]
        if isinstance(e, ast.Tuple):
            return tuple(self._arg(x) for x in e.elts)
        if isinstance(e, ast.Dict):
            return {self._arg(k): self._arg(v) for k, v in zip(e.keys, e.values) if k is not None}
        if isinstance(e, ast.Attribute):
            return self._global(e)
        if isinstance(e, ast.UnaryOp) and type(e.op) in _UNARY:
            v = self._arg(e.operand)
            if isinstance(v, Node):
                raise self.fail(f"an operator on a node inside an argument: {ast.unparse(e)!r}")
            return _UNARY[type(e.op)](v)
        if isinstance(e, ast.BinOp) and type(e.op) in _BINOPS:
            a, b = self._arg(e.left), self._arg(e.right)
            if isinstance(a, Node) or isinstance(b, Node):
                raise self.fail(f"an operator on a node inside an argument: {ast.unparse(e)!r}")
            return _BINOPS[type(e.op)](a, b)
        if isinstance(e, ast.Call):
            fn = self._global(e.func)
            if fn in _CONSTANT_CALLS:
                return fn(*[self._arg(a) for a in e.args], **{k.arg: self._arg(k.value) for k in e.keywords if k.arg})
        raise self.fail(f"cannot read the argument {ast.unparse(e)!r} (a constant FX cannot write back?)")


def graph_from_code(code: str) -> GraphModule:
    """The GraphModule whose readable code (``print_readable``) ``code`` is: see the module
    doc. The first class of ``code`` is the graph; the classes nested in it its
    submodules. Raises :class:`ReadableCodeError` for code that is not Python, holds no
    class, or holds a statement or name FX's code generator does not write."""
    # FX names a graph's class after its module, which need not be an identifier (`<lambda>`)
    code = re.sub(
        r"^(\s*class )([^(:]+)\(", lambda m: m.group(1) + re.sub(r"\W", "_", m.group(2)) + "(", code, flags=re.M
    )
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise ReadableCodeError(f"line {e.lineno}: not Python: {e.msg}") from e
    cls = next((s for s in tree.body if isinstance(s, ast.ClassDef)), None)
    if cls is None:
        raise ReadableCodeError("no class GraphModule in the code")
    gm = _Builder(cls, _stack_comments(code)).build()
    gm.graph.lint()
    return gm


def logged_meta(node: Node) -> LoggedMeta | None:
    """The annotation the log gave ``node``, parsed (:func:`parse_annotation`); None if none."""
    return parse_annotation(node.meta.get("logged"))
