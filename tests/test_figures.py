"""The docs' benchmark figures are rendered from ``benchmarks/results/*.json``
(``python -m benchmarks.figures``): the repository's pages match their results files, and a stale
figure, a stale table, a missing key, a figure without its benchmark's command nearby and a
figure that would break its paragraph each fail the check. Model-free, about a second."""

from __future__ import annotations

import json

import pytest

from benchmarks import examples, figures

from .conftest import ROOT


def test_every_figure_in_the_docs_matches_its_results_file(capsys):
    assert figures.main(["--check"]) == 0, capsys.readouterr().err + "\nrun: python -m benchmarks.figures --write"


def test_the_docs_hold_figures_and_the_design_notes_none():
    pages = {page.name if page.parent.name == "docs" else str(page.relative_to(ROOT)): page.read_text(encoding="utf-8") for page in figures.default_pages()}
    marked = {name for name, text in pages.items() if "<!-- fig" in text}
    assert {"quality.md", "calibration.md", "benchmarks.md"} <= marked
    assert "design-notes.md" not in marked, "design-notes.md is history: no figure there is rendered as current"
    # the example outputs are rendered from what the commands printed, not pasted
    assert "<!-- fig-block example_demo:transcript -->" in pages["index.md"]
    assert "<!-- fig-block example_score:transcript -->" in pages["scoring.md"] and "<!-- fig-block example_score:first_row -->" in pages["scoring.md"]


def test_the_example_outputs_and_the_screenshot_are_of_the_current_default(capsys):
    """example_score.json, example_demo.json and the screenshot's sidecar name the evaluator
    that made them: after a change of method, prompts, models, decoding or calibration they must
    be made again (a picture of an old default fails here, though a PNG cannot be compared)."""
    assert examples.main(["check"]) == 0, capsys.readouterr().err


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


# ---- example outputs: fenced blocks rendered whole from benchmarks.examples' results files

BLOCK_PAGE = """# Scoring

`python -m benchmarks.examples score` made this:

<!-- fig-block example_score:transcript -->
{transcript}<!-- /fig-block -->

and the first row:

<!-- fig-block example_score:first_row -->
{row}<!-- /fig-block -->
"""


def _example_results(directory, transcript="$ relevancy-tracer score examples/answers.jsonl\nsummary {\"rows\": 10}", row=None):
    (directory / "example_score.json").write_text(json.dumps({"transcript": transcript, "first_row": row or {"question": "Q?", "score": 0.988}}), encoding="utf-8")


def test_a_stale_block_fails_the_check_and_write_renders_it_whole(tmp_path, results, capsys):
    _example_results(results)
    page = tmp_path / "page.md"
    page.write_text(BLOCK_PAGE.format(transcript="```text\n$ relevancy-tracer score examples/answers.jsonl\n67 s\n```\n", row="```json\n{}\n```\n"), encoding="utf-8")
    assert _check(page, results, "--check") == 1
    assert "stale: " in capsys.readouterr().err
    assert _check(page, results, "--write") == 0
    text = page.read_text(encoding="utf-8")
    assert "<!-- fig-block example_score:transcript -->\n```text\n$ relevancy-tracer score examples/answers.jsonl\nsummary {\"rows\": 10}\n```\n<!-- /fig-block -->" in text
    assert "<!-- fig-block example_score:first_row -->\n```json\n{\n \"question\": \"Q?\",\n \"score\": 0.988\n}\n```\n<!-- /fig-block -->" in text
    assert _check(page, results, "--check") == 0
    # a rerun printed something else: stale again; a fence in the output gets a longer fence,
    # and a marker-like text in it is output, not a figure
    _example_results(results, transcript="```\n<!-- fig production_mix:calibration.held_out.n -->1<!-- /fig -->")
    assert _check(page, results, "--check") == 1
    assert _check(page, results, "--write") == 0
    assert "````text\n```\n<!-- fig production_mix:calibration.held_out.n -->1<!-- /fig -->\n````\n<!-- /fig-block -->" in page.read_text(encoding="utf-8")
    assert _check(page, results, "--check") == 0


@pytest.mark.parametrize("change, message", [
    (lambda text: text, "no results file benchmarks/results/example_score.json"),
    (lambda text: text.replace("example_score:transcript", "example_score:stdout"), "example_score.json has no stdout"),
    (lambda text: text.replace("`python -m benchmarks.examples score` made this", "This came"), "does not name benchmarks.examples"),
    (lambda text: text.replace("\n<!-- fig-block example_score:transcript", "\nOutput: <!-- fig-block example_score:transcript"), "stands on a line of its own"),
])
def test_a_block_without_its_file_key_or_command_fails_the_check_and_is_never_written(tmp_path, results, capsys, change, message):
    if "no results file" not in message:
        _example_results(results)
    page = tmp_path / "page.md"
    text = change(BLOCK_PAGE.format(transcript="```text\nold\n```\n", row="```json\n{}\n```\n"))
    page.write_text(text, encoding="utf-8")
    assert _check(page, results, "--check") == 2
    assert message in capsys.readouterr().err
    assert _check(page, results, "--write") == 2
    assert page.read_text(encoding="utf-8") == text


# ---- benchmarks.examples: the example outputs are made by the real commands, and a file made by
# another evaluator than the current default fails the check (a screenshot cannot be compared:
# its sidecar can)


def test_an_example_made_by_another_evaluator_or_scripted_models_or_missing_fails_the_check(tmp_path):
    current = examples.default_evaluator()
    assert current["llm_model"] == "qwen2.5-coder-1.5b" and len(current["evaluator_version"]) == 12
    good = dict(current, command="relevancy-tracer demo", scripted=False)
    files = {"current": good, "old": dict(good, evaluator_version="0123456789ab"), "method": dict(good, method="ragas_intent"), "scripted": dict(good, scripted=True), "unnamed": {"command": "relevancy-tracer demo"}}
    for name, record in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(record), encoding="utf-8")
    problems = examples.check([tmp_path / f"{name}.json" for name in [*files, "missing"]])
    assert not [p for p in problems if "current.json" in p]
    assert any("old.json was made with evaluator_version '0123456789ab'" in p for p in problems)
    assert any("method.json was made with method 'ragas_intent'" in p for p in problems)
    assert any("scripted.json was made with scripted models" in p for p in problems)
    assert any("unnamed.json has no 'method'" in p for p in problems) and any("unnamed.json has no 'evaluator_version'" in p for p in problems)
    assert any("missing.json is missing" in p for p in problems)


def test_the_score_example_is_made_by_the_real_command_and_renders_into_a_page(tmp_path, capsys):
    """``benchmarks.examples score --scripted``: `relevancy-tracer score examples/answers.jsonl`
    against a scripted model server; the stored transcript and first row render as blocks, and
    the file names its (scripted) evaluator, which the check refuses."""
    directory = tmp_path / "results"
    assert examples.main(["score", "--scripted", str(directory)]) == 0
    record = json.loads((directory / "example_score.json").read_text(encoding="utf-8"))
    rows = sum(1 for line in (ROOT / "examples" / "answers.jsonl").read_text(encoding="utf-8").splitlines() if line.strip())
    assert record["command"] == "relevancy-tracer score examples/answers.jsonl -o out.jsonl" and record["rows"] == rows == record["summary"]["scored"]
    assert record["llm_model"] == "fake-chat" and record["scripted"] and len(record["evaluator_version"]) == 12
    assert record["transcript"].startswith("$ relevancy-tracer score examples/answers.jsonl -o out.jsonl\n100%|")
    assert record["transcript"].splitlines()[-1] == "summary " + json.dumps(record["summary"], ensure_ascii=False)
    assert record["first_row"]["question"] == "What is the boiling point of water at sea level?" and record["first_row"]["evaluator_version"] == record["evaluator_version"]
    page = tmp_path / "page.md"
    page.write_text(BLOCK_PAGE.format(transcript="", row=""), encoding="utf-8")
    assert _check(page, directory, "--write") == 0 and _check(page, directory, "--check") == 0
    assert record["progress"] in page.read_text(encoding="utf-8")
    assert any("was made with scripted models" in p for p in examples.stale(record, "example_score.json"))
    with pytest.raises(SystemExit):  # a dry run never writes into the docs' results
        examples.main(["score", "--scripted", str(ROOT / "benchmarks" / "results")])


def test_the_demo_transcript_is_parsed_into_its_evaluator_and_answers():
    out = (
        "Starting Phoenix at http://127.0.0.1:4318 (working dir .phoenix, log .phoenix/phoenix.log) ...\n"
        "Scoring with qwen2.5-coder-1.5b + use-multilingual-v3 (method ragas_judge_intent).\n"
        "Loading the example RAG app (Python's language reference) ...\n"
        "Asking 2 questions; each answer is scored in the background.\n\n"
        " score  label                 why         question                                          answer\n"
        + "-" * 120 + "\n"
        " 0.000  does_not_address      hedge       What is the capital of Australia?                 I don't know: the Python language reference does not cover …\n"
        " 0.985  directly_addresses                What is the difference between the is operator …  The with statement is used for managing resources that need…\n\n"
        "2 of 2 answers scored in 1474 s.\n"
        "Labels: 1 directly_addresses, 1 does_not_address (why: hedge 1).\n"
        "Evaluator version 1556f2c1383b (relevancy.evaluator.version on each span).\n"
    )
    parsed = examples.parse_demo_stdout(out)
    assert parsed["evaluator_version"] == "1556f2c1383b" and parsed["method"] == "ragas_judge_intent" and parsed["llm_model"] == "qwen2.5-coder-1.5b"
    assert (parsed["scored"], parsed["asked"], parsed["seconds"]) == (2, 2, 1474)
    assert parsed["answers"] == [
        {"score": 0.0, "label": "does_not_address", "why": "hedge", "question": "What is the capital of Australia?", "answer": "I don't know: the Python language reference does not cover …"},
        {"score": 0.985, "label": "directly_addresses", "why": None, "question": "What is the difference between the is operator …", "answer": "The with statement is used for managing resources that need…"},
    ]
    with pytest.raises(examples.ExampleError, match="evaluator version"):
        examples.parse_demo_stdout(out.replace("Evaluator version", "Evaluator"))
