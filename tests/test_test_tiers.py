"""The suite's two tiers (the rule is in tests/conftest.py): a test that starts a system is marked `system`, so
`make test-fast` never starts one. Checked on the test files' source (the ast), without collecting them.

Seen: calls of tests.system's module_system, shared_system and start_system, faultkit's supervised, LocalLambda,
experiments' LocalRunner and run_grid, and LocalSystem (or a subclass) with a `.start()` call beside it (a test
may build one only to see it refuse), in a test or in any fixture it uses, through other fixtures too.
Not seen: `nitro up`, `nitro train --local` or a benchmark run as a subprocess; those tests carry the marker
by hand."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.conftest import SYSTEM_FIXTURES

TESTS = Path(__file__).resolve().parent
STARTERS = frozenset({"module_system", "shared_system", "start_system", "supervised", "LocalLambda", "LocalRunner", "run_grid"})


def _starts(fn: ast.AST) -> bool:
    called, names = set(), set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            called.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return bool(STARTERS & called) or ("LocalSystem" in names and "start" in called)


def _marks_system(node: ast.AST) -> bool:
    """`pytest.mark.system` somewhere in node (a decorator, a pytestmark list)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "system" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(node))


def _is_fixture(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", "")) == "fixture"
               for d in fn.decorator_list for n in ast.walk(d))


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]


def _fixtures(tree: ast.Module) -> dict[str, tuple[list[str], bool]]:
    """name -> (the fixtures it takes, whether it starts a system itself)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _is_fixture(node):
            out[node.name] = (_params(node), _starts(node))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _starts(node.value):
            for target in node.targets:  # `system = module_system("name")`
                if isinstance(target, ast.Name):
                    out[target.id] = ([], True)
    return out


def _closure(names, fixtures) -> set[str]:
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen or name not in fixtures:
            continue
        seen.add(name)
        todo.extend(fixtures[name][0])
    return seen


@functools.cache
def _modules() -> list[tuple[Path, ast.Module, dict]]:
    """(path, ast, the fixtures it sees: conftest's and its own) of every test file, read once."""
    shared = _fixtures(ast.parse((TESTS / "conftest.py").read_text()))
    out = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        out.append((path, tree, {**shared, **_fixtures(tree)}))
    return out


def _starting_tests():
    """(file, test, in the system tier) for every test that starts a system."""
    for path, tree, fixtures in _modules():
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                            and _marks_system(n.value) for n in tree.body)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
                continue
            uses = _closure(_params(node), fixtures)
            if _starts(node) or any(fixtures[f][1] for f in uses):
                marked = module_marked or any(map(_marks_system, node.decorator_list)) or bool(SYSTEM_FIXTURES & uses)
                yield path.name, node.name, marked


def test_every_test_that_starts_a_system_is_in_the_system_tier():
    found = list(_starting_tests())
    assert len(found) > 100, "the scan no longer sees the suite's system tests: STARTERS is out of date"
    unmarked = [f"{file}::{test}" for file, test, marked in found if not marked]
    assert not unmarked, ("these start a system but `make test-fast` would run them; mark them "
                          f"@pytest.mark.system (tests/conftest.py): {unmarked}")


def test_the_fixtures_that_mark_their_tests_start_a_system():
    """A fixture named as conftest's SYSTEM_FIXTURES but starting nothing would take its tests out of the fast tier."""
    idle = []
    for path, _, fixtures in _modules():
        for name in SYSTEM_FIXTURES & fixtures.keys():
            if not any(fixtures[f][1] for f in _closure([name], fixtures)):
                idle.append(f"{path.name}::{name}")
    assert not idle, f"these fixtures start no system; rename them or start one: {idle}"
