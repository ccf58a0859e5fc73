"""The documentation site (mkdocs.yml over docs/, the API reference from the docstrings) builds with --strict: a
link to a page or anchor that does not exist, a page left out of the navigation or an API reference that does not
resolve fails here, naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_site_builds_strictly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "load_policy" in api and "NitroClient" in api and "TrainingRun" in api, "the API reference is rendered"


def test_every_page_of_docs_is_in_the_navigation():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {page for entry in nav for page in entry.values()}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == listed, f"not in mkdocs.yml's nav: {sorted(pages - listed)}; missing: {sorted(listed - pages)}"
