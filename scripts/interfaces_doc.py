#!/usr/bin/env python3
"""Writes the native-module section of docs/INTERFACES.md from hetjax/_native.pyi.

The stub is the contract the C++ module is checked against
(tests/build/test_native_stub.py), so the doc is generated from it rather
than kept by hand: every function's signature and the first line of its
docstring, between the markers `<!-- native:begin -->` and
`<!-- native:end -->`. Everything outside the markers is left as it is.

    python3 scripts/interfaces_doc.py           # rewrite the section
    python3 scripts/interfaces_doc.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "hetjax" / "_native.pyi"
DOC = ROOT / "docs" / "INTERFACES.md"
BEGIN = "<!-- native:begin -->"
END = "<!-- native:end -->"


def _first_doc_line(node: ast.AST) -> str:
    doc = ast.get_docstring(node) or ""
    for line in doc.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _signature(fn: ast.FunctionDef) -> str:
    # ast.unparse writes `x: int=1`; the doc keeps the stub's `x: int = 1`.
    positional = fn.args.posonlyargs + fn.args.args
    defaults = [None] * (len(positional) - len(fn.args.defaults)) + list(fn.args.defaults)
    parts = []
    for arg, default in zip(positional, defaults):
        text = arg.arg + (f": {ast.unparse(arg.annotation)}" if arg.annotation is not None else "")
        if default is not None:
            text += f" = {ast.unparse(default)}" if arg.annotation is not None else f"={ast.unparse(default)}"
        parts.append(text)
    if fn.args.vararg or fn.args.kwonlyargs or fn.args.kwarg:
        parts = [ast.unparse(fn.args)]  # rare in a stub: take the unparser's spelling whole
    args = ", ".join(parts)
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"{fn.name}({args}){returns}"


def render_section(stub_text: str) -> str:
    """The lines that belong between the markers, for this stub."""
    module = ast.parse(stub_text)
    lines = [
        "<!-- Written by scripts/interfaces_doc.py from hetjax/_native.pyi; edit the stub, then run the script. -->",
        "",
    ]
    summary = _first_doc_line(module)
    if summary:
        lines += [summary, ""]
    lines += ["| function | what it does |", "| --- | --- |"]
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            what = _first_doc_line(node).replace("|", "\\|")
            lines.append(f"| `{_signature(node)}` | {what} |")
    return "\n".join(lines)


def render_doc(doc_text: str, stub_text: str) -> str:
    """`doc_text` with the section between the markers written from the stub."""
    start = doc_text.find(BEGIN)
    stop = doc_text.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"docs/INTERFACES.md needs the markers {BEGIN} and {END}, in that order")
    head = doc_text[: start + len(BEGIN)]
    return f"{head}\n{render_section(stub_text)}\n{doc_text[stop:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the section is not what the stub gives")
    args = parser.parse_args(argv)
    doc_text = DOC.read_text()
    wanted = render_doc(doc_text, STUB.read_text())
    if wanted == doc_text:
        return 0
    if args.check:
        print(f"{DOC.relative_to(ROOT)} is out of date with {STUB.relative_to(ROOT)}: run scripts/interfaces_doc.py")
        return 1
    DOC.write_text(wanted)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
