"""The docs' benchmark figures are rendered from ``benchmarks/results/*.json``
(``python -m benchmarks.figures``): the repository's pages match their results files, and a stale
figure, a stale table, a missing key, a figure without its benchmark's command nearby and a
figure that would break its paragraph each fail the check. Model-free, about a second."""

from __future__ import annotations

import json

import pytest

from benchmarks import figures

from .conftest import ROOT


def test_every_figure_in_the_docs_matches_its_results_file(capsys):
    assert figures.main(["--check"]) == 0, capsys.readouterr().err + "\nrun: python -m benchmarks.figures --write"


def test_the_docs_hold_figures_and_the_design_notes_none():
    pages = {page.name if page.parent.name == "docs" else str(page.relative_to(ROOT)): page.read_text(encoding="utf-8") for page in figures.default_pages()}
    marked = {name for name, text in pages.items() if "<!-- fig" in text}
    assert {"quality.md", "calibration.md", "benchmarks.md"} <= marked
    assert "design-notes.md" not in marked, "design-notes.md is history: no figure there is rendered as current"


@pytest.fixture
def results(tmp_path):
    directory = tmp_path / "results"
    directory.mkdir()
    (directory / "production_mix.json").write_text(json.dumps({"calibration": {"held_out": {"ece": 0.028, "ece_ci": [0.022, 0.052], "n": 626}}}), encoding="utf-8")
    return directory


PAGE = """# Calibration

From `python -m benchmarks.production_mix`: ECE <!-- fig production_mix:calibration.held_out.ece .3f ci -->{ece}<!-- /fig --> over
<!-- fig-table calibration.production_mix -->
| old |
<!-- /fig-table -->
"""


def _check(page, results, *extra):
    return figures.main([*extra, "--results", str(results), str(page)])


def test_a_stale_figure_fails_the_check_and_write_renders_it(tmp_path, results, capsys, monkeypatch):
    monkeypatch.setitem(figures.TABLES, "calibration.production_mix", lambda r: f"| n |\n| --- |\n| {r.get('production_mix:calibration.held_out.n')} |")
    page = tmp_path / "page.md"
    page.write_text(PAGE.format(ece="0.030 [0.022, 0.052]"), encoding="utf-8")
    assert _check(page, results, "--check") == 1
    assert "stale: " in capsys.readouterr().err
    assert _check(page, results, "--write") == 0
    text = page.read_text(encoding="utf-8")
    assert "-->0.028 [0.022, 0.052]<!-- /fig -->" in text
    assert "<!-- fig-table calibration.production_mix -->\n| n |\n| --- |\n| 626 |\n<!-- /fig-table -->" in text
    assert _check(page, results, "--check") == 0
    # a rerun of the benchmark changes the results: the page is stale again
    (results / "production_mix.json").write_text(json.dumps({"calibration": {"held_out": {"ece": 0.031, "ece_ci": [0.02, 0.05], "n": 700}}}), encoding="utf-8")
    assert _check(page, results, "--check") == 1


def test_a_stale_table_alone_fails_the_check(tmp_path, results, monkeypatch):
    monkeypatch.setitem(figures.TABLES, "calibration.production_mix", lambda r: f"| n |\n| --- |\n| {r.get('production_mix:calibration.held_out.n')} |")
    page = tmp_path / "page.md"
    page.write_text(PAGE.format(ece="0.028 [0.022, 0.052]").replace("| old |", "| n |\n| --- |\n| 625 |"), encoding="utf-8")
    assert _check(page, results, "--check") == 1


@pytest.mark.parametrize("spec, message", [
    ("production_mix:calibration.pairs.ece", "production_mix.json has no calibration.pairs"),
    ("quality_old:calibration.ece", "no results file benchmarks/results/quality_old.json"),
    ("=no_such_derivation", "no derived figure 'no_such_derivation'"),
    ("production_mix:calibration.held_out.n .2f ci", "has no interval"),
])
def test_a_missing_key_file_or_derivation_fails_the_check_and_is_never_written(tmp_path, results, capsys, spec, message):
    page = tmp_path / "page.md"
    text = f"# Calibration\n\n`python -m benchmarks.production_mix`: ECE <!-- fig {spec} -->0.028<!-- /fig -->\n"
    page.write_text(text, encoding="utf-8")
    assert _check(page, results, "--check") == 2
    assert message in capsys.readouterr().err
    assert _check(page, results, "--write") == 2
    assert page.read_text(encoding="utf-8") == text


def test_a_figure_must_have_its_benchmark_named_in_its_section(tmp_path, results, capsys):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nIntro.\n\n## Calibration\n\nECE <!-- fig production_mix:calibration.held_out.ece -->0.028<!-- /fig -->\n\n## Other\n\n`python -m benchmarks.production_mix`\n", encoding="utf-8")
    assert _check(page, results, "--check") == 2
    assert "does not name benchmarks.production_mix" in capsys.readouterr().err
    # named in the page's introduction: enough
    page.write_text("# Page\n\n`python -m benchmarks.production_mix`.\n\n## Calibration\n\nECE <!-- fig production_mix:calibration.held_out.ece -->0.028<!-- /fig -->\n", encoding="utf-8")
    assert _check(page, results, "--check") == 0


def test_a_figure_that_starts_a_line_fails_the_check(tmp_path, results, capsys):
    # Markdown reads a comment at the start of a line as an HTML block: the paragraph breaks
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n`python -m benchmarks.production_mix`: ECE\n<!-- fig production_mix:calibration.held_out.ece -->0.028<!-- /fig --> held out\n", encoding="utf-8")
    assert _check(page, results, "--check") == 2
    assert "starts its line" in capsys.readouterr().err


def test_every_results_file_has_the_benchmark_that_writes_it():
    for path in (ROOT / "benchmarks" / "results").iterdir():
        if path.name.endswith((".json", ".json.gz", ".jsonl.gz")):
            module = figures.module_of(path.name.split(".")[0])
            assert (ROOT / "benchmarks" / f"{module}.py").exists(), path.name


def test_a_marker_quoted_in_inline_code_is_an_example_not_a_figure(tmp_path, results):
    page = tmp_path / "page.md"
    text = "# Page\n\nA figure is written `<!-- fig FILE:KEY.PATH .2f -->` ... `<!-- /fig -->`.\n"
    page.write_text(text, encoding="utf-8")
    assert _check(page, results, "--check") == 0
    assert page.read_text(encoding="utf-8") == text


def test_a_table_whose_results_lack_a_key_fails_the_check(tmp_path, results, capsys, monkeypatch):
    monkeypatch.setitem(figures.TABLES, "calibration.production_mix", lambda r: f"| ece |\n| --- |\n| {r('production_mix')['calibration']['pairs_all']['ece']} |")
    page = tmp_path / "page.md"
    page.write_text(PAGE.format(ece="0.028 [0.022, 0.052]"), encoding="utf-8")
    assert _check(page, results, "--check") == 2
    assert "table calibration.production_mix: KeyError: 'pairs_all'" in capsys.readouterr().err
