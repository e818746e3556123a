"""The wheel is the product: build it (and the sdist) as a release would, install it in a fresh
virtual environment outside the checkout, and use it there as a user would.

The wheel is built from the sdist (``python -m build``'s default), so the sdist is checked too.
The fresh venv gets the extras whose code the modules import (not ``phoenix``: the server package
is only started as a program, never imported), then: ``pip check``; every module of the wheel
imports; ``relevancy-tracer --help``; ``serve`` answers an OTLP/HTTP export and exports the
evaluation; ``score`` scores a file against the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile

import pytest

from relevancy_tracer._phoenix_server import free_port
from relevancy_tracer.otel import attributes as A
from relevancy_tracer_testing import OTLPReceiver

from .conftest import ROOT, fake_model_env, subprocess_env

#: Extras whose modules' imports the venv must satisfy (see pyproject.toml).
EXTRAS = "local,minilm,e5,prometheus,pandas,service,annotations,examples"


def _run(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh venv's bin directory, a working directory outside the checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    # A copy of the files git sees (tracked, and untracked but not ignored): a checkout's stale
    # build/ or *.egg-info (whose SOURCES.txt setuptools reuses) must not fill gaps the release
    # build would have.
    source = base / "source"
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], timeout=60, cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = base / "dist"
    # --no-isolation: build with this venv's setuptools (no download); the wheel is built from
    # the unpacked sdist, in a temporary directory
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)], timeout=600, env=subprocess_env())
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, os.listdir(dist)
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    bin_dir = venv / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", f"{wheels[0]}[{EXTRAS}]"], timeout=1500, env=subprocess_env())
    work = base / "work"
    work.mkdir()
    return wheels[0], bin_dir, work


def _venv_env(**more: str) -> dict[str, str]:
    env = subprocess_env(**more)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def test_the_wheel_holds_every_module_and_the_shipped_data(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "relevancy_tracer"
    expected = {str(p.relative_to(ROOT)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    expected |= {str(p.relative_to(ROOT)) for p in (package / "calibrations").glob("*.json")}
    # the examples, the demo's app among them: a package of their own, no mapping needed
    assert {p.name for p in (package / "_examples").glob("*.py")} >= {"__init__.py", "rag_app.py", "web_service.py"}
    # PEP 561: without it, users' type checkers ignore the package's annotations
    expected.add("relevancy_tracer/py.typed")
    assert expected - names == set()
    # the lab (test servers, benchmarks, tests) is not the product
    assert not any(name.startswith(("tests/", "benchmarks/", "relevancy_tracer_testing/")) for name in names)
    assert "relevancy_tracer/testing.py" not in names


def test_pip_check_and_every_module_imports_outside_the_checkout(installed):
    wheel, bin_dir, work = installed
    _run([str(bin_dir / "python"), "-m", "pip", "check"], timeout=120, env=_venv_env())
    modules = sorted(
        name[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for name in zipfile.ZipFile(wheel).namelist()
        if name.endswith(".py") and name.startswith("relevancy_tracer/")
    )
    script = (
        "import importlib, json, sys\n"
        "import relevancy_tracer\n"
        "assert 'site-packages' in relevancy_tracer.__file__, relevancy_tracer.__file__\n"
        "failed = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed[name] = repr(exc)\n"
        "import importlib.metadata\n"
        "from relevancy_tracer._version import __version__\n"
        "failed['version'] = [importlib.metadata.version('relevancy-tracer'), __version__]\n"
        "print(json.dumps(failed))\n"
    )
    proc = _run([str(bin_dir / "python"), "-c", script, json.dumps(modules)], timeout=300, cwd=work, env=_venv_env())
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    # the distribution's version is read from _version.py at build time: one place to change it
    distribution_version, package_version = failed.pop("version")
    assert distribution_version == package_version and package_version.count(".") >= 2
    assert failed == {}
    assert len(modules) >= 40
    help_text = _run([str(bin_dir / "relevancy-tracer"), "--help"], timeout=120, cwd=work, env=_venv_env()).stdout
    for command in ("score", "calibrate", "demo", "serve", "worker", "backfill"):
        assert command in help_text


def test_score_runs_from_the_wheel_against_an_openai_compatible_server(installed, server):
    _, bin_dir, work = installed
    rows = [{"question": "Where is France and what is its capital?", "answer": f"France is in western Europe; its capital is Paris ({i})."} for i in range(3)]
    source = work / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = work / "scored.jsonl"
    env = _venv_env(**fake_model_env(server), RELEVANCY_TRACER_METHOD="ragas")
    _run([str(bin_dir / "relevancy-tracer"), "score", str(source), "-o", str(out), "--no-progress"], timeout=300, cwd=work, env=env)
    scored = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["status"] for r in scored] == ["scored"] * 3 and all(0 <= r["score"] <= 1 for r in scored)
    assert server.requests_to("chat")  # the scores came from the server, not from a local model


def test_serve_from_the_wheel_answers_an_otlp_http_export(installed, server):
    _, bin_dir, work = installed
    http_port, grpc_port = free_port(), free_port()
    with OTLPReceiver(grpc=False) as backend:
        env = _venv_env(
            **fake_model_env(server),
            RELEVANCY_TRACER_METHOD="ragas",
            OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRICS_EXPORTER="none",
        )
        command = [str(bin_dir / "relevancy-tracer"), "serve", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
        serve = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            span = {
                "traceId": "5b8efff798038103d269b633813fc60c",
                "spanId": "eee19b7ec3c1b174",
                "name": "rag.answer",
                "kind": 1,
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000001000000000",
                "attributes": [
                    {"key": "openinference.span.kind", "value": {"stringValue": "CHAIN"}},
                    {"key": "input.value", "value": {"stringValue": "Where is France and what is its capital?"}},
                    {"key": "output.value", "value": {"stringValue": "France is in western Europe and Paris is its capital."}},
                ],
            }
            body = json.dumps({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "wheel-app"}}]}, "scopeSpans": [{"spans": [span]}]}]}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/traces", data=body, headers={"Content-Type": "application/json"})
            deadline = time.monotonic() + 120
            status = None
            while status is None:
                assert serve.poll() is None, serve.stdout.read()
                try:
                    with urllib.request.urlopen(request, timeout=10) as reply:
                        status = reply.status
                except urllib.error.HTTPError as exc:
                    status = exc.code
                except (urllib.error.URLError, ConnectionError):  # not listening yet
                    assert time.monotonic() < deadline, "serve did not start listening"
                    time.sleep(0.2)
            assert status == 200
            spans = backend.wait_for_spans(lambda s: any(x["attributes"].get(A.OPENINFERENCE_SPAN_KIND) == A.SPAN_KIND_EVALUATOR for x in s), timeout=60)
            evaluation = [x for x in spans if x["attributes"].get(A.OPENINFERENCE_SPAN_KIND) == A.SPAN_KIND_EVALUATOR]
            assert len(evaluation) == 1 and evaluation[0]["attributes"][A.STATUS] == "scored"
            assert evaluation[0]["trace_id"] == span["traceId"] and evaluation[0]["parent_span_id"] == span["spanId"]
        finally:
            serve.terminate()
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait(10)
