"""The layout's rules, checked on the source: each flow goes one way (no module imports a layer
above its own), every module imports on its own (no cycles), short parameter lists, and
private torch APIs in one module."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "memcalc"

# Lowest first. A module may import its own layer and those below, never one above.
LAYERS = [
    ("memcalc.errors", "memcalc.units", "memcalc.dtypes", "memcalc.process_defaults",
     "memcalc.progress"),
    ("memcalc.specs", "memcalc.host.specs", "memcalc.strategies.specs",
     "memcalc.distributed.specs", "memcalc.eval_specs"),
    ("memcalc.model",),
    ("memcalc.distributed",),
    ("memcalc.trace",),
    ("memcalc.device", "memcalc.host"),
    ("memcalc.feed",),
    ("memcalc.report",),
    ("memcalc.strategies",),
    ("memcalc.render",),
    ("memcalc.pipeline", "memcalc.prepared_step", "memcalc.planned_batch", "memcalc.isolation", "memcalc.report_pool", "memcalc.early_workers", "memcalc.api",
     "memcalc.api_errors", "memcalc.notebook",
     "memcalc.calibration", "memcalc.cli", "memcalc.__init__", "memcalc.__main__"),
]
MAX_POSITIONAL = 7
PRIVATE_TORCH = ("torch._subclasses", "torch.utils._python_dispatch", "torch.distributed._tools",
                 "torch._C", "torch._guards", "torch.fx.experimental")


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2
                              else parts))
    return names


def _layer(module: str) -> int:
    """The layer of ``module``: the most specific prefix wins (``memcalc.host.specs`` is a spec)."""
    best, rank = "", None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, index
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return rank


def _path(module: str) -> Path:
    base = PACKAGE.parent.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _imports(module: str) -> list[tuple[int, str]]:
    """(line, imported memcalc module) for every import, lazy ones included, except those
    under ``if TYPE_CHECKING:``."""
    tree = ast.parse(_path(module).read_text())
    skipped = {id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
               and "TYPE_CHECKING" in ast.unparse(branch.test)
               for statement in branch.body for node in ast.walk(statement)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") if _is_module(
                f"{node.module}.{alias.name}") else (node.lineno, node.module)
                for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "memcalc"]


def _is_module(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.is_dir() or base.with_suffix(".py").exists()


@pytest.mark.parametrize("module", _modules())
def test_no_module_imports_a_layer_above_its_own(module):
    own = _layer(module)
    upward = [f"line {line}: {name}" for line, name in _imports(module)
              if name != "memcalc" and _layer(name) > own]
    assert not upward, f"{module} (layer {own}) imports upward: {upward}"


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_every_module_imports_alone():
    """A cycle shows up as an ImportError when its modules are imported in some order: each
    module is imported first into an interpreter holding no memcalc module."""
    script = (
        "import importlib, sys\n"
        "failures = []\n"
        f"for name in {_modules()!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'memcalc' or m.startswith('memcalc.')]:\n"
        "        del sys.modules[loaded]\n"
        "    name = 'memcalc' if name == 'memcalc.__init__' else name\n"
        "    if name == 'memcalc.__main__': continue\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        failures.append(f'{name}: {type(error).__name__}: {error}')\n"
        "print('\\n'.join(failures))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=600, cwd=PACKAGE.parent)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == ""


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, node


def test_no_function_takes_more_than_seven_positional_parameters():
    long = []
    for path, node in _functions():
        positional = [a.arg for a in node.args.posonlyargs + node.args.args
                      if a.arg not in ("self", "cls")]
        if len(positional) > MAX_POSITIONAL:
            long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
                        f"({len(positional)})")
    assert not long, long


def test_private_torch_apis_are_imported_in_one_module():
    users = {module for module in _modules() for node in ast.walk(ast.parse(_path(module).read_text()))
             if isinstance(node, (ast.Import, ast.ImportFrom))
             for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                          else [node.module or ""])
             if name.startswith(PRIVATE_TORCH)}
    assert users <= {"memcalc.trace._torch_internals"}, users


def test_the_layer_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The rule itself can fail: a trace module importing the report layer is caught."""
    fake = tmp_path / "memcalc" / "trace"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from memcalc.report.models import Report\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "memcalc")
    assert _layer("memcalc.trace.bad") < _layer("memcalc.report.models")
    assert [name for _, name in _imports("memcalc.trace.bad")] == ["memcalc.report.models"]
