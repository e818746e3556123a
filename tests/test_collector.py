"""Collector configs: the OpenTelemetry Collector (contrib) YAML files, checked structurally
(and with ``otelcol-contrib validate`` where that binary is installed), and rotel, run for real.

rotel test: ``rotel-agent`` (from the ``rotel`` PyPI package) starts with
``collector-config/rotel.env`` — only its listening addresses and exporter endpoint changed to
free ports on 127.0.0.1 and a :class:`~relevancy_tracer_testing.OTLPReceiver`. The app
(``tests/traced_app.py`` in a subprocess, ``relevancy_tracer.configure()`` with
``OTEL_EXPORTER_OTLP_ENDPOINT`` at rotel, over OTLP/HTTP or OTLP/gRPC) scores three answers
against :class:`~relevancy_tracer_testing.FakeOpenAIServer`; the scored spans and the
``relevancy.*`` metrics must reach the receiver through rotel.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver

from ._observability import COLLECTOR_CONFIG, ScoreDial, ServerProcess, TracedApp, free_port, wait_until

CONTRIB_CONFIGS = [COLLECTOR_CONFIG / "otelcol-contrib.yaml", COLLECTOR_CONFIG / "otelcol-contrib.datadog.yaml", COLLECTOR_CONFIG / "otelcol-contrib.scoring.yaml"]
ROTEL_ENV = COLLECTOR_CONFIG / "rotel.env"
README = COLLECTOR_CONFIG / "README.md"
PROMETHEUS_YML = COLLECTOR_CONFIG / "prometheus" / "prometheus.yml"

#: Component types of the contrib distribution that these configs may use, by section.
CONTRIB_TYPES = {
    "receivers": {"otlp", "prometheus", "hostmetrics"},
    "processors": {"memory_limiter", "batch", "resource", "attributes", "transform", "filter", "tail_sampling"},
    "exporters": {"otlp", "otlphttp", "prometheus", "prometheusremotewrite", "datadog", "debug", "loadbalancing"},
    "connectors": {"datadog", "spanmetrics"},
    "extensions": {"health_check", "pprof", "zpages"},
}
ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

QUESTION = "What is the capital of France?"  # tests/traced_app.py's question
SPAN_NAME = "answer_question"
SCORE = 0.85  # every answer's score, set by the embedder (dimensionless)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# ------------------------------------------------------------------------------ otelcol-contrib


@pytest.mark.parametrize("path", CONTRIB_CONFIGS, ids=lambda p: p.name)
def test_contrib_pipelines_reference_defined_known_components(path):
    """Every pipeline's receivers, processors and exporters are defined (connectors count as
    both), of contrib component types; every defined component is used; memory_limiter runs
    first and batch last; OTLP is received on 4317 (gRPC) and 4318 (HTTP)."""
    config = load(path)
    for section, known in CONTRIB_TYPES.items():
        for name in config.get(section) or {}:
            assert name.split("/")[0] in known, f"{path.name}: unknown {section[:-1]} type {name!r}"
    connectors = set(config.get("connectors") or {})
    defined = {
        "receivers": set(config["receivers"]) | connectors,
        "processors": set(config.get("processors") or {}),
        "exporters": set(config["exporters"]) | connectors,
    }
    used: dict[str, set] = {"receivers": set(), "processors": set(), "exporters": set()}
    pipelines = config["service"]["pipelines"]
    assert pipelines
    for pipeline_name, pipeline in pipelines.items():
        assert pipeline_name.split("/")[0] in {"traces", "metrics", "logs"}
        assert pipeline.get("receivers") and pipeline.get("exporters"), pipeline_name
        for kind in used:
            for component in pipeline.get(kind) or []:
                assert component in defined[kind], f"{path.name}: pipeline {pipeline_name} uses undefined {kind[:-1]} {component!r}"
                used[kind].add(component)
        processors = pipeline.get("processors") or []
        assert processors[:1] == ["memory_limiter"] and processors[-1:] == ["batch"], f"{pipeline_name}: {processors}"
    for kind in used:
        unused = (defined[kind] - connectors) - used[kind]
        assert not unused, f"{path.name}: {kind} defined but unused: {sorted(unused)}"
    for connector in connectors:  # a connector joins two pipelines: exporter of one, receiver of another
        assert connector in used["exporters"] and connector in used["receivers"], connector
    assert set(config["service"].get("extensions") or []) == set(config.get("extensions") or {})
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    assert {"traces", "metrics"} <= {name.split("/")[0] for name in pipelines}


@pytest.mark.parametrize("path", CONTRIB_CONFIGS, ids=lambda p: p.name)
def test_contrib_environment_variables_are_documented(path):
    """Every ``${env:NAME}`` is documented in the file's header and in collector-config/README.md,
    and no other substitution syntax is used."""
    text = path.read_text()
    names = {match.group(1) for match in ENV_REFERENCE.finditer(text)}
    assert names, f"{path.name} reads no environment variable"
    assert text.count("${") == len(ENV_REFERENCE.findall(text)), "use the ${env:NAME} form only"
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    readme = README.read_text()
    for name in names:
        assert re.search(rf"#\s+{name}\b", header), f"{name} is not described in {path.name}'s header"
        assert name in readme, f"{name} is not in collector-config/README.md"


def test_contrib_routes_traces_to_the_backend_and_metrics_to_prometheus():
    """Traces go to the OTLP exporter whose endpoint is ``TRACES_ENDPOINT``; metrics to the
    prometheus exporter, on the port prometheus.yml's otel-collector job scrapes."""
    config = load(CONTRIB_CONFIGS[0])
    pipelines = config["service"]["pipelines"]
    (traces_exporter,) = pipelines["traces"]["exporters"]
    assert traces_exporter.split("/")[0] == "otlp"
    assert config["exporters"][traces_exporter]["endpoint"] == "${env:TRACES_ENDPOINT}"
    assert pipelines["metrics"]["exporters"] == ["prometheus"]
    port = ENV_REFERENCE.sub(lambda m: m.group(2) or "", config["exporters"]["prometheus"]["endpoint"]).rsplit(":", 1)[1]
    scrape = {job["job_name"]: job for job in load(PROMETHEUS_YML)["scrape_configs"]}["otel-collector"]
    assert [target.rsplit(":", 1)[1] for target in scrape["static_configs"][0]["targets"]] == [port]
    assert scrape["honor_labels"] is True


def test_datadog_variant_sends_traces_and_metrics_to_datadog():
    config = load(CONTRIB_CONFIGS[1])
    assert config["exporters"]["datadog"]["api"]["key"] == "${env:DD_API_KEY}"
    pipelines = config["service"]["pipelines"]
    assert "datadog" in pipelines["traces"]["exporters"] and pipelines["metrics"]["exporters"] == ["datadog"]


def test_scoring_variant_fans_traces_out_to_the_backend_and_the_scoring_fleet_by_trace_id():
    """Every trace goes to the backend and, routed by trace id over OTLP/gRPC to port 4317 of
    each resolved `serve` instance, to the scoring fleet, with retries on UNAVAILABLE (a full
    scoring queue) and a sending queue; logs (GenAI content events) go to the fleet through the
    same exporter, so a span and its events reach the same instance."""
    config = load(CONTRIB_CONFIGS[2])
    exporters = config["service"]["pipelines"]["traces"]["exporters"]
    assert exporters == ["otlp/traces", "loadbalancing/scoring"]
    assert config["service"]["pipelines"]["logs"]["exporters"] == ["loadbalancing/scoring"]
    assert config["service"]["pipelines"]["logs"]["receivers"] == ["otlp"]
    balancer = config["exporters"]["loadbalancing/scoring"]
    assert balancer["routing_key"] == "traceID"
    assert balancer["resolver"]["dns"] == {"hostname": "${env:SCORING_SERVICE_HOSTNAME}", "port": 4317}
    otlp = balancer["protocol"]["otlp"]
    assert otlp["retry_on_failure"]["enabled"] and otlp["sending_queue"]["enabled"]
    assert config["exporters"]["otlp/traces"]["endpoint"] == "${env:TRACES_ENDPOINT}"


@pytest.mark.parametrize("path", CONTRIB_CONFIGS, ids=lambda p: p.name)
def test_otelcol_contrib_validate(path):
    """``otelcol-contrib validate`` (only where the binary is installed: it is not packaged for
    Debian nor on PyPI, so CI has it only if someone installs it)."""
    import shutil

    binary = shutil.which("otelcol-contrib")
    if binary is None:
        pytest.skip("otelcol-contrib is not on PATH (not installable here); the structural tests above cover the config")
    env = dict(os.environ, TRACES_ENDPOINT="127.0.0.1:4317", DD_API_KEY="0" * 32)
    result = subprocess.run([binary, "validate", f"--config={path}"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------ rotel


def rotel_agent() -> str:
    """The rotel-agent binary shipped in the rotel package (a dev dependency)."""
    try:
        import rotel
    except ImportError:
        pytest.fail("the rotel package is not installed: pip install -e '.[dev]' (make test does)")
    path = Path(rotel.__file__).parent / "rotel-agent"
    assert path.is_file() and os.access(path, os.X_OK), path
    return str(path)


def rotel_env_settings() -> dict[str, str]:
    """The active ``KEY=VALUE`` lines of collector-config/rotel.env."""
    settings = {}
    for line in ROTEL_ENV.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def test_rotel_env_names_real_rotel_settings():
    """Every ROTEL_* name in rotel.env (set or suggested in comments) is one that
    ``rotel-agent start --help`` lists, and the file sets the receivers and an OTLP exporter."""
    help_text = subprocess.run([rotel_agent(), "start", "--help"], capture_output=True, text=True, timeout=30).stdout
    known = set(re.findall(r"\[env: (ROTEL_[A-Z0-9_]+)=", help_text))
    assert len(known) > 20, help_text[:500]
    mentioned = set(re.findall(r"\bROTEL_[A-Z0-9_]+", ROTEL_ENV.read_text()))
    assert mentioned - known == set()
    settings = rotel_env_settings()
    assert {"ROTEL_OTLP_GRPC_ENDPOINT", "ROTEL_OTLP_HTTP_ENDPOINT", "ROTEL_EXPORTER", "ROTEL_OTLP_EXPORTER_ENDPOINT", "ROTEL_OTLP_EXPORTER_PROTOCOL"} <= set(settings)
    assert settings["ROTEL_EXPORTER"] == "otlp"


@contextlib.contextmanager
def rotel_to_serve(serve_http_port: int, tmp_path: Path) -> Iterator[int]:
    """rotel-agent running with collector-config/rotel.env, its exporter at a `serve` on
    ``serve_http_port`` and its metrics receiver off (serve takes traces and logs); yields
    rotel's OTLP/HTTP port."""
    grpc_port, http_port = free_port(), free_port()
    settings = rotel_env_settings()
    settings.update(
        ROTEL_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{grpc_port}",
        ROTEL_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{http_port}",
        ROTEL_OTLP_EXPORTER_ENDPOINT=f"http://127.0.0.1:{serve_http_port}",
        ROTEL_OTLP_RECEIVER_METRICS_DISABLED="true",
        ROTEL_PID_FILE=str(tmp_path / "rotel.pid"),
        ROTEL_LOG_FILE=str(tmp_path / "rotel-agent.log"),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROTEL_", "OTEL_"))}
    env.update(settings)
    with ServerProcess([rotel_agent(), "start"], tmp_path / "rotel.log", env=env) as rotel:
        wait_until(lambda: rotel.check_running() or (port_open(grpc_port) and port_open(http_port)), 30, "rotel's OTLP ports")
        yield http_port


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_scored_spans_and_metrics_pass_through_rotel(tmp_path, protocol):
    """App -> rotel (OTLP over ``protocol``) -> OTLPReceiver (rotel.env's exporter protocol):
    the three answer spans arrive with relevancy.score = 0.85 and three generated questions,
    and the relevancy.score histogram with count 3 and sum 2.55."""
    agent = rotel_agent()
    grpc_port, http_port = free_port(), free_port()
    with OTLPReceiver() as receiver, FakeOpenAIServer(embedder=ScoreDial(QUESTION, SCORE)) as models:
        settings = rotel_env_settings()
        exporter_protocol = settings["ROTEL_OTLP_EXPORTER_PROTOCOL"]
        settings.update(
            ROTEL_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{grpc_port}",
            ROTEL_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{http_port}",
            ROTEL_OTLP_EXPORTER_ENDPOINT=receiver.http_endpoint if exporter_protocol == "http" else receiver.grpc_endpoint,
            ROTEL_PID_FILE=str(tmp_path / "rotel.pid"),
            ROTEL_LOG_FILE=str(tmp_path / "rotel-agent.log"),
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROTEL_", "OTEL_"))}
        env.update(settings)
        with ServerProcess([agent, "start"], tmp_path / "rotel.log", env=env) as rotel:
            wait_until(lambda: rotel.check_running() or (port_open(grpc_port) and port_open(http_port)), 30, "rotel's OTLP ports")
            app_port = http_port if protocol == "http/protobuf" else grpc_port
            app_env = {
                "OTEL_SERVICE_NAME": "rotel-e2e",
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{app_port}",
            }
            with TracedApp(models.base_url, app_env, calls=3) as app:
                status = app.stop(timeout=60)  # three calls, then shutdown() flushes spans and metrics
            assert status == 0, "".join(app.output)[-3000:]
            assert app.output[-1].strip() == "done 3"

            def scored(spans: list[dict]) -> list[dict]:
                return [s for s in spans if s["name"] == SPAN_NAME and "relevancy.score" in s["attributes"]]

            spans = scored(receiver.wait_for_spans(lambda spans: len(scored(spans)) >= 3, timeout=30))
            assert len(spans) == 3, f"{len(spans)} scored spans arrived; rotel log:\n{rotel.tail()}"
            for span in spans:
                attributes = span["attributes"]
                assert attributes["relevancy.status"] == "scored"
                assert attributes["relevancy.score"] == pytest.approx(SCORE, abs=1e-6)
                assert attributes["relevancy.label"] == "directly_addresses"
                questions = attributes["relevancy.generated_questions"]
                assert len(questions) == 3 and all("Paris is the capital of France" in q for q in questions)
                assert span["resource"]["service.name"] == "rotel-e2e"

            def score_histogram() -> dict | None:
                points = [value for name, attrs, value in receiver.metrics if name == "relevancy.score" and attrs.get("span.name") == SPAN_NAME]
                return points[-1] if points and points[-1]["count"] == 3 else None

            histogram = wait_until(score_histogram, 30, "the relevancy.score histogram through rotel")
            assert histogram["sum"] == pytest.approx(3 * SCORE, abs=1e-5)
            counts = [value for name, attrs, value in receiver.metrics if name == "relevancy.evaluations" and attrs.get("relevancy.status") == "scored"]
            assert counts and counts[-1] == 3
            rotel.check_running()
