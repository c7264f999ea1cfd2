"""The packages import in one direction only: the launcher never imports the Computer.

Every module of a package is parsed (not imported) and each `import` and
`from … import` anywhere in it, inside functions too, is checked.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(package: str) -> dict[str, set[str]]:
    """Module file (relative to the repo) → the absolute module names it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT)
        module = ".".join(relative.with_suffix("").parts)
        if path.name == "__init__.py":
            module = module.removesuffix(".__init__")
        is_package = path.name == "__init__.py"
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.add(_absolute(module, is_package, node.module, node.level))
        found[str(relative)] = names
    assert found, f"no modules found in {package}"
    return found


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def offending(package: str, allowed: Callable[[str], bool]) -> list[str]:
    """Each import of `package` that `allowed` refuses, with the module that makes it."""
    return [
        f"{path} imports {name}"
        for path, names in imported_modules(package).items()
        for name in sorted(names)
        if not allowed(name)
    ]


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("package", ["sandbox_launcher", "crew_common"])
def test_launcher_and_common_never_import_the_computer_or_the_server(package: str) -> None:
    forbidden = {"computer_service", "crew_server"}
    assert offending(package, lambda name: _top(name) not in forbidden) == []


def test_common_is_standard_library_uvicorn_and_pydantic_only() -> None:
    # pydantic: the launcher API's wire models (`crew_common/launcher_wire.py`).
    allowed = set(sys.stdlib_module_names) | {"crew_common", "uvicorn", "pydantic", "__future__"}
    assert offending("crew_common", lambda name: _top(name) in allowed) == []


def test_relative_imports_are_resolved() -> None:
    assert _absolute("sandbox_launcher.app", False, "models", 1) == "sandbox_launcher.models"
    assert _absolute("sandbox_launcher", True, "app", 1) == "sandbox_launcher.app"
    assert _absolute("a.b.c", False, None, 2) == "a"
