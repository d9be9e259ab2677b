"""The import rules of the package: import-linter's contracts (pyproject's
[tool.importlinter]: the layers from the CLI down to the bridge, a jax-free
planner) and no import circle between any two modules of hetjax.

Run from anywhere: `python scripts/lint_imports.py`. The package is read
from this checkout; an editable install's import hook is set aside, since it
would make the repository root a part of the package.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _this_checkout_first() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
    sys.path.insert(0, str(ROOT))


def _native_only(graph, importer: str, imported: str) -> bool:
    """An import of the compiled extension (`from hetjax import _native`):
    grimp reads only Python files and takes it for the package itself."""
    details = graph.get_import_details(importer=importer, imported=imported)
    return bool(details) and all(d["line_contents"].split("#")[0].strip().endswith("import _native") for d in details)


def circles(package: str) -> list[list[str]]:
    """Every set of modules of `package` that import each other in a circle
    (strongly connected components of the import graph, at module or
    function level), each sorted."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False)
    modules = sorted(graph.modules)
    edges = {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if not _native_only(graph, m, i))
        for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in modules:
        if start in index:
            continue
        # Tarjan's algorithm without recursion: (module, next edge to follow).
        work = [(start, 0)]
        while work:
            node, k = work.pop()
            if k == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
            if k < len(edges[node]):
                work.append((node, k + 1))
                nxt = edges[node][k]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def main() -> int:
    _this_checkout_first()
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"))
    found = circles("hetjax")
    for members in found:
        print(f"import circle: {' <-> '.join(members)}")
    if not found:
        print("no import circles in hetjax")
    return 1 if code or found else 0


if __name__ == "__main__":
    sys.exit(main())
