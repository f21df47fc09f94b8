"""Layers: render → report → estimators → trace. Below the top layer (rendering, the CLI,
the library API, notebook wiring) no module imports it, so reports stay plain data."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "memcalc"
TOP_LAYER = ("memcalc.render", "memcalc.cli", "memcalc.api", "memcalc.notebook")
TOP_PACKAGES = ("render", "cli")
TOP_FILES = ("__init__.py", "__main__.py", "api.py", "notebook.py")


def _in_the_top_layer(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] in TOP_PACKAGES or len(parts) == 1 and parts[0] in TOP_FILES


BELOW = sorted(path for path in PACKAGE.rglob("*.py") if not _in_the_top_layer(path))


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_scan_covers_the_models_and_skips_the_top_layer():
    assert PACKAGE / "report" / "models.py" in BELOW
    assert PACKAGE / "strategies" / "report.py" in BELOW
    assert not [path for path in BELOW if _in_the_top_layer(path)]
    assert PACKAGE / "notebook.py" not in BELOW and PACKAGE / "render" / "html.py" not in BELOW


@pytest.mark.parametrize("path", BELOW, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_module_below_the_top_layer_imports_it(path):
    upward = sorted(name for name in _imported(path)
                    if any(name == top or name.startswith(top + ".") for top in TOP_LAYER))
    assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}"
