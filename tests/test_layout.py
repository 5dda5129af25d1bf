"""The tests mirror the code: every product package has its folder of tests, helpers shared between
tests live in tests/support, conftest.py files hold fixtures and hooks only, and no test module imports
another test module (a test file is never a library: moving or renaming it must break nothing else)."""

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SHARED = "tests.support"
NOT_A_PACKAGE = {"support", "browser"}  # helpers, and the console driven end to end across every app


def product_packages() -> set[str]:
    """The packages the wheel ships (pyproject's list), each a folder of the repository."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return {pattern.rstrip("*") for pattern in find["include"]}


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything ``source`` imports, anywhere in it (functions too); for
    ``from a import b`` the name is ``a.b``, as ``b`` may be a module."""
    package = module.rsplit(".", 1)[0].split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join([*base, *([node.module] if node.module else [])])
            yield from ((node.lineno, f"{origin}.{alias.name}") for alias in node.names)


def reaches_a_test_module(name: str) -> bool:
    inside_tests = name == "tests" or name.startswith("tests.")
    return inside_tests and not (name == SHARED or name.startswith(f"{SHARED}."))


def test_no_test_module_imports_another():
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in imported(path.read_text(), module_of(path))
        if reaches_a_test_module(name)
    ]
    hint = "shared helpers belong in tests/support, shared fixtures in a conftest.py"
    assert not found, hint + ":\n" + "\n".join(found)


def test_the_import_check_sees_every_way_of_importing():
    lines = [
        "from {t}.conftest import principal",
        "import {t}.regions.test_reconciler",
        "from {t}.regions import conftest",
        "from . import test_gateway",
        "from ..billing.test_billing import HISTORY",
        "def helper():",
        "    from {t}.registry.conftest import register",
        "from {t}.support.regions import tiny_version",
        "from {t} import support",
        "import {t}.support.gateway",
    ]
    source = "\n".join(lines).format(t="tests")  # spelt so that grepping the suite finds no such import
    names = imported(source, "tests.gateway.test_spool")
    caught = [line for line, name in names if reaches_a_test_module(name)]
    assert caught == [1, 2, 3, 4, 5, 7]


def test_every_product_package_has_its_tests_and_every_tests_folder_a_package():
    packages = product_packages()
    assert {"controlplane", "gateway"} <= packages
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - folders == set(), "a product package without tests/<package>/"
    assert folders - packages - NOT_A_PACKAGE == set(), "tests/<folder>/ that mirrors no product package"
    assert all(any((TESTS / p).glob("test_*.py")) for p in packages)


def test_conftest_files_hold_fixtures_and_hooks_only():
    def allowed(node: ast.stmt) -> bool:
        if isinstance(node, ast.Import | ast.ImportFrom):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
            return True
        if isinstance(node, ast.FunctionDef):
            fixture = any("fixture" in ast.unparse(d) for d in node.decorator_list)
            return fixture or node.name.startswith("pytest_")
        return False

    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(TESTS.rglob("conftest.py"))
        for node in ast.parse(path.read_text()).body
        if not allowed(node)
    ]
    assert not found, "helpers and constants belong in tests/support:\n" + "\n".join(found)
