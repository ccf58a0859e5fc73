"""The local system's components run the code of the tree that started them (a grid's clone included), not
whatever tree an editable install points at: the repository root is on their PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nitro
from nitro.local.system import _repo_root


def test_the_components_pythonpath_is_the_directory_that_holds_the_packages():
    root = Path(_repo_root())
    for package in ("nitro", "learner_svc", "scaler_svc", "detector_svc", "actor_fn"):
        assert (root / package / "__init__.py").exists(), f"{package} is not under {root}"
    assert root == Path(nitro.__file__).resolve().parents[1]


def test_a_component_started_elsewhere_imports_this_tree(tmp_path):
    env = {**os.environ, "PYTHONPATH": _repo_root()}
    out = subprocess.run([sys.executable, "-c", "import learner_svc, nitro; print(nitro.__file__); "
                          "print(learner_svc.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert all(Path(p).resolve().is_relative_to(Path(_repo_root())) for p in out)
