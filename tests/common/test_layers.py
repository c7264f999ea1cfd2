"""The packages import in layers: every arrow that must never exist is checked here.

Every module of a package is parsed (not imported) and each `import` and
`from … import` anywhere in it, inside functions too, is checked. A failure
names the file, the line and the forbidden import.

The arrows docs/architecture.md draws, and the ones it rules out:
- `sandbox_launcher` and `crew_common` import neither the Computer nor the server;
- `crew_common` is the standard library, uvicorn and pydantic only;
- `crew_shim` (it runs inside the sandbox, from a copied package) imports only
  the standard library and itself;
- `crew_server` imports nothing of the Computer or the launcher, and the Computer
  nothing of the server or the launcher (they talk over HTTP);
- production code imports no harness or test package; `crew_harness` does not
  import `crew_testkit` (the test kit builds on the harness, not the reverse).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ["computer_service", "sandbox_launcher", "crew_common", "crew_shim", "crew_server"]
HARNESS_AND_TESTS = {"crew_harness", "crew_testkit", "tests"}
STANDARD_LIBRARY = set(sys.stdlib_module_names)


@dataclass(frozen=True)
class Import:
    """One import statement's module, absolute, and where it is written."""

    path: str
    line: int
    module: str

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


def imports_of(package: str, root: Path = ROOT) -> list[Import]:
    """Every import in `package`'s modules (relative ones made absolute), in file order."""
    found: list[Import] = []
    paths = sorted((root / package).rglob("*.py"))
    assert paths, f"no modules found in {package}"
    for path in paths:
        relative = path.relative_to(root)
        is_package = path.name == "__init__.py"
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [_absolute(module, is_package, node.module, node.level)]
            else:
                continue
            found += [Import(str(relative), node.lineno, name) for name in names]
    return sorted(found, key=lambda i: (i.path, i.line, i.module))


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def refused(package: str, allowed: Callable[[Import], bool], root: Path = ROOT) -> list[str]:
    """Each import of `package` that `allowed` refuses, as `file:line imports module`."""
    return [str(i) for i in imports_of(package, root) if not allowed(i)]


def none_of(packages: set[str]) -> Callable[[Import], bool]:
    return lambda i: i.top not in packages


def assert_none(found: list[str]) -> None:
    """Fail listing every forbidden import, one `file:line imports module` a line."""
    assert not found, "forbidden imports:\n" + "\n".join(found)


@pytest.mark.parametrize("package", ["sandbox_launcher", "crew_common"])
def test_launcher_and_common_import_neither_the_computer_nor_the_server(package: str) -> None:
    assert_none(refused(package, none_of({"computer_service", "crew_server"})))


def test_common_is_standard_library_uvicorn_and_pydantic_only() -> None:
    # pydantic: the launcher API's wire models (`crew_common/launcher_wire.py`).
    allowed = STANDARD_LIBRARY | {"crew_common", "uvicorn", "pydantic"}
    assert_none(refused("crew_common", lambda i: i.top in allowed))


def test_the_shim_imports_only_the_standard_library_and_itself() -> None:
    allowed = STANDARD_LIBRARY | {"crew_shim"}
    assert_none(refused("crew_shim", lambda i: i.top in allowed))


def test_the_server_imports_nothing_of_the_computer_or_the_launcher() -> None:
    assert_none(refused("crew_server", none_of({"computer_service", "sandbox_launcher"})))


def test_the_computer_imports_nothing_of_the_server_or_the_launcher() -> None:
    assert_none(refused("computer_service", none_of({"crew_server", "sandbox_launcher"})))


@pytest.mark.parametrize("package", PRODUCTION)
def test_production_code_imports_no_harness_or_test_package(package: str) -> None:
    assert_none(refused(package, none_of(HARNESS_AND_TESTS)))


def test_the_harness_imports_no_test_kit_or_test() -> None:
    assert_none(refused("crew_harness", none_of({"crew_testkit", "tests"})))


def test_a_forbidden_import_inside_a_function_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "crew_server" / "api").mkdir(parents=True)
    (tmp_path / "crew_server" / "__init__.py").write_text("")
    (tmp_path / "crew_server" / "api" / "__init__.py").write_text("from ..store import rooms\n")
    (tmp_path / "crew_server" / "api" / "late.py").write_text(
        "import json\n\n\ndef later():\n    from computer_service.texts import render\n"
    )
    found = refused("crew_server", none_of({"computer_service", "sandbox_launcher"}), root=tmp_path)
    assert found == ["crew_server/api/late.py:5 imports computer_service.texts"]
    assert "crew_server/api/__init__.py:1 imports crew_server.store" in map(
        str, imports_of("crew_server", tmp_path)
    )


def test_relative_imports_are_resolved() -> None:
    assert _absolute("sandbox_launcher.app", False, "models", 1) == "sandbox_launcher.models"
    assert _absolute("sandbox_launcher", True, "app", 1) == "sandbox_launcher.app"
    assert _absolute("a.b.c", False, None, 2) == "a"
