"""The docs name code that exists: every backticked dotted name rooted in one of the project's packages
resolves (import, then attributes), every repository path they cite exists, and every `path.py: name`
reference names something that file defines or assigns. Docs stay true when code moves (docs/architecture.md
is the living design); a rename that leaves a doc behind fails here, naming the doc, line and reference."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("nitro", "learner_svc", "detector_svc", "scaler_svc", "actor_fn", "experiments")
TOP_DIRS = (*PACKAGES, "tests", "bench", "deploy", "protos", "docs", "examples")
# Paths the docs tell a user to create; they are not in the repository.
USER_CREATED = {"deploy/docker/.env"}

DOTTED = re.compile(r"`((?:%s)(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`" % "|".join(PACKAGES))
PATH = re.compile(r"`((?:%s)/[\w./-]+)" % "|".join(TOP_DIRS))
PATH_NAMES = re.compile(r"`((?:%s)/[\w./-]+\.py): ([^`]+)`" % "|".join(PACKAGES + ("tests", "bench")))


def _docstrings() -> list[tuple[str, str]]:
    """(where, text) of every module, class and function docstring of the project's packages (the generated
    nitro/v1 aside): a docstring that names code is documentation too."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts[:2]:
                continue
            tree = ast.parse(path.read_text())
            for node in (tree, *ast.walk(tree)):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        line = node.body[0].lineno if node.body else 1
                        out.append((f"{path.relative_to(ROOT)}:{line}", doc))
    return out


DOCSTRINGS = _docstrings()
# In docstrings code is often named bare, without backticks: a package-rooted dotted name, a repository path.
BARE_DOTTED = re.compile(r"(?<![\w./`-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))
BARE_PATH = re.compile(r"(?<![\w./`-])((?:%s)/[\w./-]*\w\.(?:py|md|sh|ya?ml|json|proto|txt))" % "|".join(TOP_DIRS))


def _refs(pattern: re.Pattern, docstrings: bool = True) -> list[tuple[str, re.Match]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in pattern.finditer(text):
            out.append((f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m))
    if docstrings:
        out += [(where, m) for where, text in DOCSTRINGS for m in pattern.finditer(text)]
    return out


def resolves(name: str) -> bool:
    """Whether a dotted name is a module, or attributes of the longest importable module prefix.
    `nitro.v1.X` is a protobuf message or service of the generated nitro.v1 modules."""
    parts = name.split(".")
    if parts[:2] == ["nitro", "v1"] and len(parts) >= 3:
        import nitro.v1 as v1

        modules = [importlib.import_module(f"nitro.v1.{p.stem}") for p in Path(v1.__file__).parent.glob("*_pb2*.py")]
        return any(hasattr(m, parts[2]) for m in modules) or _attrs(importlib.import_module("nitro.v1"), parts[2:])
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return _attrs(module, parts[i:])
    return False


def _attrs(obj, names: list[str]) -> bool:
    for n in names:
        if not hasattr(obj, n):
            return False
        obj = getattr(obj, n)
    return True


def defines(source: str, name: str) -> bool:
    """Whether `source` defines or assigns every part of a (possibly dotted) name: def, class, an
    assignment or annotation, or an import."""
    return all(re.search(rf"(?m)^\s*(?:async\s+def|def|class)\s+{re.escape(p)}\b|^\s*{re.escape(p)}\s*[:=]"
                         rf"|\bimport\b[^\n]*\b{re.escape(p)}\b", source) for p in name.split("."))


def test_the_checks_can_fail():
    assert resolves("nitro.contracts.stream_key") and not resolves("nitro.contracts.no_such_name")
    assert not resolves("nitro.batching.split_batch")  # the module lives in nitro.data now
    assert resolves("nitro.v1.TrainingSpec") and not resolves("nitro.v1.NoSuchMessage")
    src = "class A:\n    def run(self):\n        pass\nLIMIT = 3\n"
    assert defines(src, "A.run") and defines(src, "LIMIT") and not defines(src, "A.walk")


@pytest.mark.parametrize("where,match", _refs(DOTTED), ids=lambda v: v if isinstance(v, str) else v.group(1))
def test_dotted_name_resolves(where, match):
    assert resolves(match.group(1)), f"{where}: `{match.group(1)}` does not resolve to a module or attribute"


def test_bare_names_and_paths_in_docstrings_exist():
    wrong = []
    for where, text in DOCSTRINGS:
        wrong += [f"{where}: {name}" for m in BARE_DOTTED.finditer(text) for name in [m.group(1).rstrip(".")]
                  if not name.endswith((".py", ".md")) and not resolves(name)]
        wrong += [f"{where}: {m.group(1)}" for m in BARE_PATH.finditer(text)
                  if not any(c in m.group(1) for c in "*{<") and not (ROOT / m.group(1)).exists()]
    assert not wrong, "docstrings that name code or paths that do not exist:\n" + "\n".join(wrong)


def test_cited_paths_exist():
    missing = []
    for where, m in _refs(PATH):
        path = m.group(1).rstrip(".,:;")
        if any(c in path for c in "*{<") or path in USER_CREATED:
            continue  # a pattern or placeholder, or a file the user creates
        if not (ROOT / path).exists():
            missing.append(f"{where}: {path}")
    assert not missing, "paths the docs cite that do not exist:\n" + "\n".join(missing)


def test_path_colon_names_are_defined_there():
    wrong = []
    for where, m in _refs(PATH_NAMES):
        path, names = m.group(1), m.group(2)
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        for name in (n.strip() for n in names.split(",")):
            if re.fullmatch(r"[A-Za-z_][\w.]*", name) and not defines(source, name):
                wrong.append(f"{where}: {path} does not define {name}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_environment_variables_the_docs_name_are_read_somewhere():
    code = "\n".join(p.read_text(errors="replace") for d in (*PACKAGES, "bench", "deploy") for p in (ROOT / d).rglob("*")
                     if p.is_file() and (p.suffix in (".py", ".sh", ".yaml", ".yml") or "Dockerfile" in p.name))
    unused = sorted({f"{v} ({where})" for where, m in _refs(re.compile(r"\b(NITRO_[A-Z0-9_]*[A-Z0-9])\b"), docstrings=False)
                     for v in [m.group(1)] if not re.search(rf"\b{v}\b", code)})
    assert not unused, "environment variables the docs name but no code, script or manifest reads:\n" + "\n".join(unused)
