"""Imports run down the layers (docs/architecture.md, "Layers"), read from the source with ast, lazy imports
inside functions included:

- bench/ and experiments/ use the library (nitro) only: never tests/ (not even a dotted name in a string,
  such as a Lambda handler's) and never a service's or a function's code (learner_svc, scaler_svc,
  detector_svc, actor_fn); the one exception, EXCEPTIONS, says why.
- the library (nitro/) imports none of those, nor bench/ or experiments/.
- the algorithm cores import only what lies below them: nitro/scaling the foundations (FOUNDATIONS), nitro/algos
  those, nitro.policy and nitro.scaling (nitro.algos.ppo estimates the noise scale with nitro.scaling.noise, so
  nitro/scaling never imports nitro.algos), nitro/detector those and nitro.algos. Never the spec, the data
  plane (the codec), RPC, the client, the local system or the training pipelines (nitro/training) above them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("learner_svc", "scaler_svc", "detector_svc", "actor_fn")
NOT_LIBRARY = ("tests", "bench", "experiments", *SERVICES)
# Shared by every layer: the contracts, errors, hyperparameters, the pure cost model and the CPU clock.
FOUNDATIONS = ("nitro.contracts", "nitro.errors", "nitro.config", "nitro.cost", "nitro.clock")
CORES = {
    "nitro/scaling": (*FOUNDATIONS, "nitro.scaling"),
    "nitro/algos": (*FOUNDATIONS, "nitro.algos", "nitro.policy", "nitro.scaling"),
    "nitro/detector": (*FOUNDATIONS, "nitro.detector", "nitro.algos", "nitro.policy"),
}
# (file, module) pairs allowed although a rule above forbids them, and why.
EXCEPTIONS = {
    # The bench measures the scaler's and the detector's own per-round Redis bookkeeping, which exists only
    # inside their servicers: it runs the servicers (the classes each server.py serves) in process against a
    # real Redis, with no network between, so nothing else is timed.
    ("bench/bookkeeping_growth.py", "scaler_svc.server"),
    ("bench/bookkeeping_growth.py", "detector_svc.server"),
}
DOTTED_TESTS = re.compile(r"^tests(\.\w+)+$")


def _package(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file; `from a import b` gives a.b as well as a, so that
    `from nitro import spec` names nitro.spec."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = _package(path).split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names if alias.name != "*"]
    return out


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _files(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((ROOT / d).rglob("*.py"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _report(bad: list[tuple[str, int, str]]) -> str:
    """One line per offending import statement, naming its shortest offending module."""
    first: dict[tuple[str, int], str] = {}
    for where, line, what in bad:
        if (where, line) not in first or len(what) < len(first[where, line]):
            first[where, line] = what
    return "\n".join(f"{where}:{line}: {what}" for (where, line), what in sorted(first.items()))


def test_bench_and_experiments_use_only_the_library():
    bad = []
    for path in _files("bench", "experiments"):
        for line, module in imports(path):
            excepted = [m for f, m in EXCEPTIONS if f == _rel(path)]
            if _under(module, ("tests", *SERVICES)) and not _under(module, excepted):
                bad.append((_rel(path), line, f"imports {module}"))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED_TESTS.match(node.value):
                bad.append((_rel(path), node.lineno, f"names {node.value!r}"))
    assert not bad, "bench/ and experiments/ import the library only:\n" + _report(bad)


def test_the_library_imports_no_service_tests_or_scripts():
    bad = [(_rel(path), line, f"imports {module}") for path in _files("nitro") for line, module in imports(path)
           if _under(module, NOT_LIBRARY)]
    assert not bad, "nitro/ is the library; services, tests, bench and experiments sit above it:\n" + _report(bad)


def test_algorithm_cores_import_only_what_lies_below():
    bad = []
    for folder, allowed in CORES.items():
        for path in _files(folder):
            for line, module in imports(path):
                if not _under(module, ("nitro", *NOT_LIBRARY)):
                    continue  # the standard library and third-party packages
                if module == "nitro" or _under(module, allowed):
                    continue  # `from nitro import x` is judged by its nitro.x
                bad.append((_rel(path), line, f"imports {module}"))
    assert not bad, "an algorithm core imports a layer above it:\n" + _report(bad)
