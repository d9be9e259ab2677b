"""The import rules hold (scripts/lint_imports.py, also run by the linters):
import-linter's layers contract, from the CLI down to the bridge, a planner
without jax, and no import circle anywhere in hetjax."""

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT

pytest.importorskip("importlinter", reason="import-linter comes with the [test] extra")


def test_the_package_keeps_its_layers_and_has_no_circles():
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "lint_imports.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 broken" in done.stdout and "no import circles" in done.stdout, done.stdout[-2000:]


def test_a_circle_through_a_function_level_import_is_found(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        from lint_imports import circles
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text(textwrap.dedent("def f():\n    from circled import c\n"))
    (package / "c.py").write_text("import circled.a\n")
    (package / "d.py").write_text("from circled import _native\n")  # an extension grimp cannot see
    monkeypatch.syspath_prepend(str(tmp_path))
    assert circles("circled") == [["circled.a", "circled.b", "circled.c"]]


def test_import_hetjax_leaves_jax_unimported_until_the_bridge_is_used():
    code = (
        "import sys, hetjax\n"
        "assert 'jax' not in sys.modules, 'import hetjax imported jax'\n"
        "assert hetjax.parse_islands('cpu,cpu')[1].name == 'island1'\n"
        "assert callable(hetjax.send) and 'jax' in sys.modules\n"
        "print(sorted(set(hetjax.__all__) - set(dir(hetjax)) - set(hetjax._BRIDGE)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout
