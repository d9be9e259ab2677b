"""docs/INTERFACES.md's native-module section is what scripts/interfaces_doc.py
writes from hetjax/_native.pyi (pure text: no build, no import of the module)."""

import importlib.util

import pytest


def _load_script(repo_root):
    spec = importlib.util.spec_from_file_location("interfaces_doc", repo_root / "scripts" / "interfaces_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_native_section_is_written_from_the_stub(repo_root):
    script = _load_script(repo_root)
    doc = (repo_root / "docs" / "INTERFACES.md").read_text()
    stub = (repo_root / "hetjax" / "_native.pyi").read_text()
    assert script.render_doc(doc, stub) == doc, (
        "docs/INTERFACES.md's native-module section differs from hetjax/_native.pyi: "
        "run `python3 scripts/interfaces_doc.py` and commit the result"
    )


def test_every_stub_function_is_listed(repo_root):
    script = _load_script(repo_root)
    section = script.render_section((repo_root / "hetjax" / "_native.pyi").read_text())
    for name in ("start", "send_array", "ffi_targets"):
        assert f"| `{name}(" in section


def test_missing_markers_are_a_clear_error(repo_root):
    script = _load_script(repo_root)
    with pytest.raises(ValueError, match="native:begin"):
        script.render_doc("# no markers here\n", "def f() -> None: ...\n")
