"""The documentation: the mkdocs-material site in ``docs/`` builds with ``--strict`` (a broken
link, a page missing from the nav or a missing image fails the build), offline; the README stays
within its budget and every file it links to exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

from .conftest import ROOT, subprocess_env

#: the README's budget in lines (issue 25): what it is, the two commands, a screenshot, the
#: decorator, where scores appear, links; everything else is in docs/
README_LINES = 250


def test_the_docs_site_builds_strictly_with_every_page_in_the_nav(tmp_path):
    site = tmp_path / "site"
    env = subprocess_env(NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav):
        for entry in nav:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(config["nav"]))
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}, "every page of docs/ is in mkdocs.yml's nav, and only those"
    for page in listed:
        built = site / ("index.html" if page == "index.md" else page[: -len(".md")] + "/index.html")
        assert built.stat().st_size > 0, page
        # a list written right under a paragraph's line (no blank line) renders as "- " text
        html = built.read_text(encoding="utf-8")
        flat = re.search(r"<p>(?:(?!</p>).)*\n(?:- |\d+\. )(?:(?!</p>).)*</p>", html, re.S)
        assert flat is None, f"{page}: a list rendered as a paragraph (add a blank line before it): {flat.group(0)[:300] if flat else ''}"
    # offline: the theme loads no web fonts (theme.font: false)
    assert "fonts.googleapis.com" not in (site / "index.html").read_text(encoding="utf-8")
    for image in ("phoenix-trace.png", "phoenix-annotation.png", "calibration.png"):
        assert (site / "images" / image).stat().st_size > 10_000, image


def test_the_readme_fits_its_budget_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_LINES
    assert "make demo" in text and "make test" in text
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, "the README links to the docs"
    missing = [t for t in targets if t and not os.path.exists(ROOT / t)]
    assert missing == []
