"""The docs' example outputs and the README's screenshot, made by running the real commands.

docs/scoring.md shows what ``relevancy-tracer score`` printed on ``examples/answers.jsonl`` and
the first row it wrote; docs/index.md shows what ``relevancy-tracer demo`` printed; README.md
and docs/index.md show an answer span in Phoenix (``docs/images/phoenix-trace.png``). Each is
made by one command here, which stores what the command printed with the command itself, the
package version, the evaluator (method, ``relevancy.evaluator.version``, models), the CPU cores
and the date; ``python -m benchmarks.figures --write`` renders the stored outputs into the pages
(``<!-- fig-block example_score:transcript -->`` blocks), and ``tests/test_figures.py`` fails
while a page differs from its file or a file was made by another evaluator than the current
default (``python -m benchmarks.examples check``)::

    python -m benchmarks.examples score        # relevancy-tracer score examples/answers.jsonl -o out.jsonl
    python -m benchmarks.examples demo         # relevancy-tracer demo (exits once every answer is in Phoenix)
    python -m benchmarks.examples screenshot   # tests/test_phoenix.py's demo and browser tests
    python -m benchmarks.examples all          # the three, then python -m benchmarks.figures --write
    python -m benchmarks.examples check        # exit 1 unless all three are of the current default

The first three run the embedded default and load its models: run them under the machine's
model lock (``flock /tmp/relevancy-model.lock python -m benchmarks.examples all``; about 30
minutes on 2 cores, most of it the demo's 9 generated answers). Each runs with this
environment minus every ``RELEVANCY_TRACER_*``, ``OTEL_*``, ``OPENAI_*`` and ``PHOENIX_*``
setting (the model cache directory is kept): the defaults, as a new user gets them.

``--scripted DIR`` is a dry run with the scripted models of ``relevancy_tracer_testing`` (a
model server on 127.0.0.1 for ``score``; scripted model-host models and passage answers for
``demo``; the browser test's own scripted app for ``screenshot``), writing into ``DIR``, never
into ``benchmarks/results`` or ``docs/images``: it checks the commands and their parsing in
seconds, without a model. Its files carry the scripted evaluator, which ``check`` refuses.

Results (``benchmarks/results/example_score.json``, ``example_demo.json``; the screenshot's
sidecar ``docs/images/phoenix-trace.json``) hold the same keys: ``command``, ``version``,
``date``, ``cpus``, ``method``, ``evaluator_version``, ``llm_model``, ``embedding_model``,
``scripted``; then what the command printed (``transcript``: the command line and its output as
the docs show it) and the figures the docs quote from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from relevancy_tracer.demo import SPAN_NAME as DEMO_SPAN  # the demo's answer spans: the screenshot shows one

from ._paths import ROOT

RESULTS = ROOT / "benchmarks" / "results"
SCREENSHOT = ROOT / "docs" / "images" / "phoenix-trace.png"
#: The screenshot's sidecar: what the span in the picture carries (written by the browser test).
SCREENSHOT_SIDECAR = SCREENSHOT.with_suffix(".json")
#: The example file ``score`` runs on (shipped in the repository, not in the wheel).
EXAMPLE_ROWS = ROOT / "examples" / "answers.jsonl"
SCORE_COMMAND = ["relevancy-tracer", "score", "examples/answers.jsonl", "-o", "out.jsonl"]
DEMO_COMMAND = ["relevancy-tracer", "demo"]
#: The tests that make the screenshot: the demo's real traces, then Chromium on one of them.
SCREENSHOT_TESTS = ["tests/test_phoenix.py", "-k", "test_demo_scores_answers_into_phoenix or test_phoenix_ui_shows_the_relevancy_attributes"]
#: The fields of the first output row the docs show (the input's own fields left out but the
#: question), floats rounded to 3 digits.
SHOWN_ROW_FIELDS = ("question", "score", "raw_score", "calibrated", "evaluator_version", "label", "explanation", "failure_kind", "evidence", "prior", "method", "components", "generated_questions", "similarities", "noncommittal", "status", "latency_ms")
#: The keys by which a results file names its evaluator (checked against the current default).
EVALUATOR_KEYS = ("method", "evaluator_version")


class ExampleError(Exception):
    """A command failed or printed something its parser does not recognise."""


# ------------------------------------------------------------------------------ the evaluator


def default_evaluator() -> dict:
    """The current default evaluator, computed from the package without loading a model:
    ``method``, ``evaluator_version`` (12 hex digits, as on every span), ``llm_model`` and
    ``embedding_model``, for the settings a new user gets (no environment) with the embedded
    models (the default where the ``local`` extra is installed, as the examples run)."""
    from relevancy_tracer.config import Settings
    from relevancy_tracer.scoring.engine import Engine

    settings = Settings.resolve(environ={}, llm="local", embeddings="local")
    engine = Engine(settings)
    models = engine.models  # built, not loaded: the model host starts on the first request
    version = engine.identity(settings, models)[2]
    embedder = models.embedder
    return {"method": settings.method, "evaluator_version": version, "llm_model": models.llm.name, "embedding_model": embedder.name if embedder is not None else None}


def stale(record: dict, name: str, current: Optional[dict] = None) -> list[str]:
    """Why ``record`` (a results file's content, called ``name``) is not of the current default
    evaluator: a missing key, or a method or evaluator version that differs; [] when current."""
    current = current or default_evaluator()
    problems = []
    for key in EVALUATOR_KEYS:
        if key not in record:
            problems.append(f"{name} has no {key!r}")
        elif record[key] != current[key]:
            problems.append(f"{name} was made with {key} {record[key]!r}, the default's is {current[key]!r}")
    if record.get("scripted"):
        problems.append(f"{name} was made with scripted models (--scripted)")
    return problems


def check(paths: Optional[list[Path]] = None) -> list[str]:
    """The problems of the examples' results files and the screenshot's sidecar: missing, or
    not of the current default (:func:`stale`). Rerun ``python -m benchmarks.examples NAME``."""
    paths = paths if paths is not None else [RESULTS / "example_score.json", RESULTS / "example_demo.json", SCREENSHOT_SIDECAR]
    current = default_evaluator()
    problems = []
    for path in paths:
        name = _name(path)
        if not path.exists():
            problems.append(f"{name} is missing")
            continue
        problems += stale(json.loads(path.read_text(encoding="utf-8")), name, current)
    return problems


# ------------------------------------------------------------------------------ running commands


def clean_env(**more: str) -> dict[str, str]:
    """This process's environment without the settings a user may have set (``RELEVANCY_TRACER_*``
    but the model cache directory, ``OTEL_*``, ``OPENAI_*``, ``PHOENIX_*``), plus ``more``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELEVANCY_TRACER_", "OTEL_", "OPENAI_", "PHOENIX_")) or k == "RELEVANCY_TRACER_CACHE_DIR"}
    env.update(more)
    return env


def _console_script() -> str:
    script = Path(sys.executable).parent / "relevancy-tracer"
    return str(script) if script.exists() else "relevancy-tracer"


def _run(argv: list[str], env: dict, cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - began
    if proc.returncode != 0:
        raise ExampleError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc, elapsed


def _common(command: list[str], scripted: bool) -> dict:
    from relevancy_tracer import __version__

    return {
        "command": " ".join(command),
        "version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "scripted": scripted,
    }


def _round(value: Any, digits: int = 3) -> Any:
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, list):
        return [_round(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------ score


PROGRESS = re.compile(r"^\s*\d+%\|.*\|\s*[\d.]+[kMGTPEZY]?/[\d.]+[kMGTPEZY]? \[.*\]\s*$")


def parse_score_stderr(stderr: str) -> tuple[str, str]:
    """(the progress bar's last state, the summary line) of ``relevancy-tracer score``'s stderr;
    the bar is redrawn with carriage returns on a terminal and with newlines into a pipe."""
    lines = [part.rstrip() for line in stderr.splitlines() for part in line.split("\r")]
    bars = [line.strip() for line in lines if PROGRESS.match(line)]
    summaries = [line for line in lines if line.startswith("summary ")]
    if not bars or not summaries:
        raise ExampleError(f"no progress bar or no summary line in relevancy-tracer score's stderr:\n{stderr[-3000:]}")
    return bars[-1], summaries[-1]


def record_score(env: dict, scripted: bool = False) -> dict:
    """Run ``relevancy-tracer score examples/answers.jsonl -o out.jsonl`` (in a temporary
    directory holding a copy of the example file) and return its record."""
    from relevancy_tracer.config import Settings

    with tempfile.TemporaryDirectory(prefix="example-score-") as work:
        (Path(work) / "examples").mkdir()
        shutil.copyfile(EXAMPLE_ROWS, Path(work) / "examples" / "answers.jsonl")
        proc, elapsed = _run([_console_script(), *SCORE_COMMAND[1:]], env, Path(work), timeout=3600)
        rows = [json.loads(line) for line in (Path(work) / "out.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    progress, summary_line = parse_score_stderr(proc.stderr)
    versions = sorted({row.get("evaluator_version") for row in rows})
    methods = sorted({row.get("method") for row in rows})
    if len(versions) != 1 or len(methods) != 1:
        raise ExampleError(f"the rows were scored by more than one evaluator: {versions} {methods}")
    settings = Settings.resolve(environ=env)
    record = _common(SCORE_COMMAND, scripted)
    record.update(
        method=methods[0],
        evaluator_version=versions[0],
        llm_model=settings.resolved_llm_model,
        embedding_model=settings.resolved_embedding_model,
        concurrency=settings.concurrency,
        rows=len(rows),
        seconds=round(elapsed, 1),
        summary=json.loads(summary_line[len("summary "):]),
        progress=progress,
        transcript="\n".join(["$ " + " ".join(SCORE_COMMAND), progress, summary_line]),
        first_row={key: _round(rows[0].get(key)) for key in SHOWN_ROW_FIELDS},
        stderr=proc.stderr[-20000:],
    )
    return record


# ------------------------------------------------------------------------------ demo


#: ``--scripted``: the demo with the scripted model-host models, and the example app answering
#: with passage sentences retrieved by the scripted embedder, or "I don't know" to the questions
#: its reference does not cover (no model anywhere).
SCRIPTED_DEMO = """
import sys
from relevancy_tracer_testing import use_scripted_host_models
use_scripted_host_models()
from relevancy_tracer._examples import rag_app
rag_app.EMBEDDING_MODEL = "fake-host-embed"  # the scripted embedder, through the model host
# the scripted answers: passage sentences, and "I don't know" where the reference has no answer
rag_app.local_generator = lambda question, passages: rag_app.UNKNOWN if any(w in question for w in ("Australia", "numpy", "FIFA")) else rag_app.extractive_generator(question, passages)
from relevancy_tracer.cli import main
sys.exit(main(sys.argv[1:]))
"""

ROW = re.compile(r"^\s*(?P<score>\d\.\d{3}|-)\s{2}(?P<label>\S+)\s+")


def parse_demo_stdout(stdout: str) -> dict:
    """The figures of ``relevancy-tracer demo``'s output: models and method, the evaluator
    version, one entry per answer (score, label, why, question, answer as printed, shortened),
    the scored count and the seconds it reports."""
    models = re.search(r"^Scoring with (?P<llm>\S+) \+ (?P<embedding>\S+) \(method (?P<method>\w+)\)\.$", stdout, re.M)
    version = re.search(r"^Evaluator version (?P<version>[0-9a-f]{12}) ", stdout, re.M)
    done = re.search(r"^(?P<scored>\d+) of (?P<asked>\d+) answers scored in (?P<seconds>\d+) s", stdout, re.M)
    if not (models and version and done):
        raise ExampleError(f"relevancy-tracer demo's output lacks its models, evaluator version or count:\n{stdout[-3000:]}")
    lines = stdout.splitlines()
    header = next((i for i, line in enumerate(lines) if line.lstrip().startswith("score  label")), None)
    if header is None:
        raise ExampleError("relevancy-tracer demo printed no result table")
    answers = []
    for line in lines[header + 2:]:
        if not line.strip():
            break
        # columns: score (6), label (20), why (10), question (48), answer; two spaces apart
        score, label, why, question, answer = line[0:6], line[8:28], line[30:40], line[42:90], line[92:]
        answers.append({"score": None if score.strip() == "-" else float(score), "label": label.strip(), "why": why.strip() or None, "question": question.strip(), "answer": answer.strip()})
    return {
        "llm_model": models["llm"], "embedding_model": models["embedding"], "method": models["method"],
        "evaluator_version": version["version"], "scored": int(done["scored"]), "asked": int(done["asked"]),
        "seconds": int(done["seconds"]), "answers": answers,
    }


def record_demo(env: dict, scripted: bool = False) -> dict:
    """Run ``relevancy-tracer demo`` (Phoenix on 4318 when free, else on a free port; its working
    directory in a temporary directory) and return its record."""
    from relevancy_tracer._phoenix_server import free_port, port_is_free

    port = 4318 if port_is_free(4318) else free_port()
    env = dict(env, PHOENIX_PORT=str(port))
    argv = [sys.executable, "-c", SCRIPTED_DEMO, *DEMO_COMMAND[1:]] if scripted else [_console_script(), *DEMO_COMMAND[1:]]
    with tempfile.TemporaryDirectory(prefix="example-demo-") as work:
        proc, elapsed = _run(argv, env, Path(work), timeout=7200)
    parsed = parse_demo_stdout(proc.stdout)
    if parsed["scored"] != parsed["asked"]:
        raise ExampleError(f"the demo scored {parsed['scored']} of {parsed['asked']} answers:\n{proc.stdout[-3000:]}")
    record = _common(DEMO_COMMAND, scripted)
    record.update(parsed)
    record.update(phoenix_port=port, transcript="$ " + " ".join(DEMO_COMMAND) + "\n" + proc.stdout.rstrip("\n"), stderr=proc.stderr[-20000:])
    return record


# ------------------------------------------------------------------------------ screenshot


def screenshot_sidecar(screenshot: Path, span: dict) -> dict:
    """Write the sidecar of ``screenshot`` (same name, ``.json``): what the span in the picture
    carries (a Phoenix span as its REST API returns it), with the command that made it; returns
    it. Called by the browser test that takes the screenshot."""
    attrs = span["attributes"]
    record = _common(["python", "-m", "benchmarks.examples", "screenshot"], scripted=False)
    del record["scripted"]  # a scripted model's span has another evaluator version: check() refuses it
    record.update(
        pytest=" ".join(["pytest", *SCREENSHOT_TESTS[:2], f'"{SCREENSHOT_TESTS[2]}"']),
        image=screenshot.name,
        span=span["name"],
        trace_id=span["context"]["trace_id"],
        method=attrs.get("relevancy.method"),
        evaluator_version=attrs.get("relevancy.evaluator.version"),
        llm_model=attrs.get("relevancy.llm.model"),
        embedding_model=attrs.get("relevancy.embedding.model"),
        label=attrs.get("relevancy.label"),
        score=attrs.get("relevancy.score"),
        question=attrs.get("input.value"),
    )
    sidecar = screenshot.with_suffix(".json")
    sidecar.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return record


def take_screenshot(env: dict, screenshot: Path, scripted: bool = False) -> dict:
    """Run the demo test (real traces in the test module's Phoenix) and the browser test, which
    saves ``screenshot`` and its sidecar (``.json``: what the span in the picture carries).
    ``scripted``: the browser test alone, on its own scripted app's span."""
    tests = ["tests/test_phoenix.py", "-k", "test_phoenix_ui_shows_the_relevancy_attributes"] if scripted else SCREENSHOT_TESTS
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    env = dict(env, RELEVANCY_TRACER_SCREENSHOT=str(screenshot))
    sidecar = screenshot.with_suffix(".json")
    before = sidecar.stat().st_mtime_ns if sidecar.exists() else None
    proc, _ = _run(argv, env, ROOT, timeout=7200)
    if " passed" not in proc.stdout or not sidecar.exists() or sidecar.stat().st_mtime_ns == before:
        raise ExampleError(f"the browser test wrote no new {sidecar}:\n{proc.stdout[-3000:]}")
    record = json.loads(sidecar.read_text(encoding="utf-8"))
    if not scripted and record["span"] != DEMO_SPAN:
        raise ExampleError(f"the screenshot shows a {record['span']!r} span, not one of the demo's answers ({DEMO_SPAN!r}): did the demo test run?\n{proc.stdout[-3000:]}")
    return record


# ------------------------------------------------------------------------------ main


def _name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _write(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {_name(path)}: {record['method']} evaluator {record['evaluator_version']} ({record['llm_model']} + {record['embedding_model']})", flush=True)


def _scripted_score_env() -> tuple[dict, Callable[[], None]]:
    from relevancy_tracer_testing import FakeOpenAIServer

    server = FakeOpenAIServer().start()
    env = clean_env(RELEVANCY_TRACER_LLM="openai", RELEVANCY_TRACER_EMBEDDINGS="openai", RELEVANCY_TRACER_LLM_BASE_URL=server.base_url, RELEVANCY_TRACER_LLM_MODEL="fake-chat", RELEVANCY_TRACER_EMBEDDING_MODEL="fake-embed")
    return env, server.stop


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("score", "demo", "screenshot", "all", "check"))
    parser.add_argument("--scripted", type=Path, metavar="DIR", help="a dry run with scripted models, writing into DIR (not benchmarks/results or docs/images)")
    args = parser.parse_args(argv)
    if args.what == "check":
        problems = check()
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("rerun: flock /tmp/relevancy-model.lock python -m benchmarks.examples all", file=sys.stderr)
        return 1 if problems else 0
    scripted = args.scripted is not None
    if scripted and args.scripted.resolve() in (RESULTS.resolve(), SCREENSHOT.parent.resolve()):
        parser.error("--scripted writes into a directory of its own, never benchmarks/results or docs/images")
    results = args.scripted if scripted else RESULTS
    screenshot = results / SCREENSHOT.name if scripted else SCREENSHOT
    steps = ["score", "demo", "screenshot"] if args.what == "all" else [args.what]
    try:
        for step in steps:
            if step == "score":
                env, stop = _scripted_score_env() if scripted else (clean_env(), lambda: None)
                try:
                    _write(record_score(env, scripted), results / "example_score.json")
                finally:
                    stop()
            elif step == "demo":
                env = clean_env(RELEVANCY_TRACER_LLM_MODEL="fake-host-chat", RELEVANCY_TRACER_EMBEDDING_MODEL="fake-host-embed") if scripted else clean_env()
                _write(record_demo(env, scripted), results / "example_demo.json")
            else:
                sidecar = take_screenshot(clean_env(), screenshot, scripted)
                print(f"wrote {_name(screenshot)} and its sidecar: {sidecar['method']} evaluator {sidecar['evaluator_version']}, {sidecar['label']} {sidecar['score']}", flush=True)
    except ExampleError as exc:
        print(f"benchmarks.examples: {exc}", file=sys.stderr)
        return 1
    if not scripted:
        from . import figures

        stale_pages, errors = figures.process(figures.default_pages(), write=True)
        for line in [*errors, *("rewrote " + page for page in stale_pages)]:
            print(line, file=sys.stderr)
        problems = check() if args.what == "all" else []
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2 if errors or problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
