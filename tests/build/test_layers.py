"""Layers point one way: the library (bridge, collectives, pipeline) never
imports the client (the CLI, its job builders, the model zoo, the bundled
models), at module level or inside a function."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hetjax"
LIBRARY = ("bridge", "collectives", "pipeline")
CLIENT = (
    "hetjax.cli",
    "hetjax.train",
    "hetjax.data_job",
    "hetjax.plan_command",
    "hetjax.zoo",
    "hetjax.models",
    "models",
)


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("layer", LIBRARY)
def test_the_library_does_not_import_the_client(layer):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"no modules under hetjax/{layer}"
    wrong = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in files
        for name in _imports(path)
        if any(name == c or name.startswith(c + ".") for c in CLIENT)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_of_the_client(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from hetjax import train\n    from hetjax.zoo import model_of\n")
    assert {"hetjax.train", "hetjax.zoo"} <= set(_imports(module))
