"""Benchmark figures in the chapters, read from the committed JSON at build time.

A chapter never types a measured number. It writes where the number lives::

    {{ fig("benchmarks/throughput.json", "minivllm.output_tokens_per_s", ",.0f") }}

and the build puts in ``23,409``. The arguments:

- the JSON file, relative to ``docs/`` and under ``benchmarks/``, the folder the
  ``minivllm bench`` commands write to;
- the value: a dotted key path (``minivllm.output_tokens_per_s``, ``rows.2.ms_per_step``;
  a list element is picked by index or by its fields, ``decode[batch=64,context=8192]``),
  or arithmetic over several such paths and numbers (``caching_off.seconds /
  caching_on.seconds``, ``minivllm.fraction_of_roofline * 100``), for a figure that is a
  unit conversion or a ratio of figures measured in the same run;
- a Python format spec (``",.0f"``, ``".2f"``); ``".3g"`` when left out.

Figures cannot drift from their JSON (a re-run updates every chapter that quotes it), and
an unknown file or key fails ``mkdocs build --strict`` naming the page and the line. The
mkdocs hook (``minivllm_docs.py``) and the tests (``tests/docs/test_figures.py``) share
this module.
"""

from __future__ import annotations

import ast
import html
import json
import operator
import re
from collections.abc import Callable
from pathlib import Path

from doclinks import CODE_SPAN_RE, iter_markdown

FIGURES_DIR = "benchmarks"
"""Folder of ``docs/`` that holds the committed benchmark JSON; figures come only from it."""

# {{ fig("file.json", "key path or arithmetic", "format spec") }}; the format is optional.
FIG_RE = re.compile(r"\{\{\s*fig\((?P<args>[^{}]*?)\)\s*\}\}")
# A key path: names and indices joined by dots, each part optionally followed by a
# [field=value,...] selector. It never starts right after a digit or a dot (1e12 is a number).
KEY_PATH_RE = re.compile(r"(?<![\w.\]])[A-Za-z_]\w*(?:\[[^\]]*\])?(?:\.\w+(?:\[[^\]]*\])?)*")
SELECTOR_RE = re.compile(r"^(?P<name>\w+)(?:\[(?P<where>[^\]]*)\])?$")
KEY_PART_RE = re.compile(r"\w+(?:\[[^\]]*\])?")

_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class FigureError(LookupError):
    """A figure names a file, key or format that does not resolve."""


def _parse_args(args: str) -> tuple[str, str, str]:
    """``"file", "value", "spec"`` -> the three strings (spec defaults to ``.3g``)."""
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError as exc:
        raise FigureError(f"cannot parse the arguments ({exc.msg})") from None
    assert isinstance(call, ast.Call)
    values = [a.value for a in call.args if isinstance(a, ast.Constant)]
    if call.keywords or len(values) != len(call.args) or not 2 <= len(values) <= 3:
        raise FigureError('write fig("benchmarks/<file>.json", "<key path>", "<format spec>")')
    if not all(isinstance(v, str) for v in values):
        raise FigureError("every argument of fig() is a string")
    path, expr = values[0], values[1]
    spec = values[2] if len(values) == 3 else ".3g"
    return path, expr, spec


def _select(items: list, where: str, key: str) -> object:
    """The one element of ``items`` whose fields equal every ``field=value`` of ``where``."""
    wanted: dict[str, str] = {}
    for cond in where.split(","):
        field, sep, value = cond.partition("=")
        if not sep:
            raise FigureError(f"selector [{where}] of {key!r}: write [field=value,...]")
        wanted[field.strip()] = value.strip()
    found = [
        item
        for item in items
        if isinstance(item, dict)
        and all(field in item and str(item[field]) == v for field, v in wanted.items())
    ]
    if len(found) != 1:
        raise FigureError(f"{len(found)} elements of {key!r} match [{where}], not one")
    return found[0]


def lookup(data: object, key: str) -> object:
    """The value at a dotted key path (``a.b.0.c``, ``rows[batch=256].ms_per_step``)."""
    node = data
    parts = KEY_PART_RE.findall(key)
    if ".".join(parts) != key:
        raise FigureError(f"bad key path {key!r}: write a.b.0.c or a[field=value].b")
    for part in parts:
        match = SELECTOR_RE.match(part)
        if match is None:
            raise FigureError(f"bad key part {part!r} in {key!r}")
        name, where = match["name"], match["where"]
        if isinstance(node, list) and name.isdigit():
            if int(name) >= len(node):
                raise FigureError(f"index {name} out of range in {key!r}")
            node = node[int(name)]
        elif isinstance(node, dict) and name in node:
            node = node[name]
        else:
            raise FigureError(f"no key {name!r} (in {key!r})")
        if where is not None:
            if not isinstance(node, list):
                raise FigureError(f"{name!r} in {key!r} is not a list to select from")
            node = _select(node, where, key)
    return node


def _number(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FigureError(f"{key!r} is {value!r}, not a number")
    return float(value)


def evaluate(data: object, expr: str) -> float:
    """A key path, or ``+ - * /`` and parentheses over key paths and numbers."""
    names: dict[str, float] = {}

    def stand_in(match: re.Match[str]) -> str:
        name = f"_k{len(names)}"
        names[name] = _number(lookup(data, match[0]), match[0])
        return name

    try:
        tree = ast.parse(KEY_PATH_RE.sub(stand_in, expr).strip(), mode="eval").body
    except SyntaxError:
        raise FigureError(f"cannot parse {expr!r}") from None

    def calc(node: ast.expr) -> float:
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](calc(node.left), calc(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -calc(node.operand)
        raise FigureError(f"{expr!r}: only key paths, numbers and + - * / are allowed")

    try:
        return calc(tree)
    except ZeroDivisionError:
        raise FigureError(f"{expr!r} divides by zero") from None


class FigureResolver:
    """Resolves ``{{ fig(...) }}`` against the JSON files of one docs folder.

    Args:
        docs_dir: the ``docs/`` folder; figure files are looked up under its ``benchmarks/``.
    """

    def __init__(self, docs_dir: Path) -> None:
        self.docs_dir = docs_dir
        self._json: dict[str, object] = {}

    def load(self, path: str) -> object:
        """The parsed JSON file ``path`` (relative to ``docs/``), cached."""
        if path not in self._json:
            if not path.startswith(f"{FIGURES_DIR}/") or not path.endswith(".json"):
                raise FigureError(f"figures come from {FIGURES_DIR}/**/*.json, not {path!r}")
            file = self.docs_dir / path
            if not file.is_file():
                raise FigureError(f"file docs/{path} does not exist")
            try:
                self._json[path] = json.loads(file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise FigureError(f"docs/{path} is not valid JSON: {exc}") from None
        return self._json[path]

    def value(self, args: str) -> tuple[str, str, float]:
        """(file, expression, value) of one ``fig(...)`` argument list."""
        path, expr, _ = _parse_args(args)
        return path, expr, evaluate(self.load(path), expr)

    def text(self, args: str) -> str:
        """The formatted figure alone, as plain text (the README's status table)."""
        path, expr, spec = _parse_args(args)
        value = evaluate(self.load(path), expr)
        try:
            return format(value, spec)
        except ValueError as exc:
            raise FigureError(f"bad format spec {spec!r}: {exc}") from None

    def render(self, args: str) -> str:
        """The formatted figure, in a span whose tooltip names its source."""
        path, expr, _ = _parse_args(args)
        title = html.escape(f"{path}: {expr}", quote=True)
        return f'<span class="mini-fig" title="{title}">{self.text(args)}</span>'

    def rewrite(self, markdown: str, page_uri: str) -> tuple[str, list[str]]:
        """Replace every figure of a page outside code; one error per unresolved figure."""
        out: list[str] = []
        errors: list[str] = []
        for kind, item in iter_markdown(markdown):
            if kind != "text":
                fence = item
                out.append(f"{fence.indent}{fence.fence}{fence.info}")  # type: ignore[union-attr]
                out += fence.body  # type: ignore[union-attr]
                out.append(f"{fence.indent}{fence.fence}")  # type: ignore[union-attr]
                continue
            lineno, line = item  # type: ignore[misc]
            spans = [m.span() for m in CODE_SPAN_RE.finditer(line)]

            def replace(m: re.Match[str], lineno: int = lineno, spans: list = spans) -> str:
                if any(start <= m.start() < end for start, end in spans):
                    return m[0]
                try:
                    return self.render(m["args"])
                except FigureError as exc:
                    errors.append(f"{page_uri}:{lineno}: unresolved figure fig({m['args']}): {exc}")
                    return f"`UNRESOLVED fig({m['args']})`"

            out.append(FIG_RE.sub(replace, line))
        return "\n".join(out), errors


def find_figures(markdown: str) -> list[tuple[int, str]]:
    """(line, argument list) of every figure of a page outside code blocks and spans."""
    found: list[tuple[int, str]] = []
    for kind, item in iter_markdown(markdown):
        if kind == "text":
            lineno, line = item  # type: ignore[misc]
            spans = [m.span() for m in CODE_SPAN_RE.finditer(line)]
            found += [
                (lineno, m["args"])
                for m in FIG_RE.finditer(line)
                if not any(start <= m.start() < end for start, end in spans)
            ]
    return found
