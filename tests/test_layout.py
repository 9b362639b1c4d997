"""The house rules of the layout (docs/design.md): the product (jfa.api, jfa.knobs, jfa.kernels) imports
nothing of the harness; jfa.kernels never imports the reference; importing jfa touches no GPU and no
harness; every JFA_* variable is read in jfa.knobs alone."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jfa"
HARNESS = ("jfa.oracle", "jfa.fuzz", "jfa.sim", "jfa.bench")
PRODUCT = [PACKAGE / name for name in ("__init__.py", "api.py", "block_sparse.py", "dispatch.py", "knobs.py", "mx.py")] + sorted((PACKAGE / "kernels").rglob("*.py"))


def _imports(path: Path) -> set:
    """Every module ``path`` imports, at module level or inside functions (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", PRODUCT, ids=[str(p.relative_to(ROOT)) for p in PRODUCT])
def test_the_product_imports_nothing_of_the_harness(path):
    bad = {name for name in _imports(path) if name.startswith(HARNESS) or
           (path.is_relative_to(PACKAGE / "kernels") and name.startswith("jfa.reference"))}
    assert not bad, f"{path.relative_to(ROOT)} imports the harness: {sorted(bad)}"


def test_the_rule_test_catches_a_product_that_imports_the_harness(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    from jfa.fuzz.rule import run_case\n")
    assert "jfa.fuzz.rule" in _imports(sneaky)


def test_importing_the_product_loads_no_harness_and_no_triton():
    code = ("import sys, jfa, jfa.api, jfa.knobs, jfa.kernels.schedule; "
            "print(sorted(m for m in sys.modules if m.startswith(('jfa.oracle', 'jfa.fuzz', 'jfa.sim', 'jfa.bench', "
            "'triton'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_jfa_variable_is_read_in_knobs_alone():
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")) + [ROOT / "conftest.py"]:
        if path.name == "knobs.py":
            continue
        text = path.read_text()
        if re.search(r"""environ(\.get)?\s*[\[(]\s*["']JFA_""", text) or re.search(r"""getenv\(\s*["']JFA_""", text):
            readers.append(str(path.relative_to(ROOT)))
    assert not readers, f"JFA_* read outside jfa/knobs.py: {readers}"
