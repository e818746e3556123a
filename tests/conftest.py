"""Shared fixtures: a real OpenAI-compatible server on 127.0.0.1 and engines pointed at it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from relevancy_tracer.config import Settings
from relevancy_tracer.scoring.engine import Engine
from relevancy_tracer_testing import FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("RELEVANCY_TRACER_SHARED", ROOT.parent / "shared"))
WIKIEVAL = SHARED / "data" / "wikieval_dev.jsonl"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's RELEVANCY_TRACER_* / OPENAI_* settings."""
    for name in list(os.environ):
        if name.startswith("RELEVANCY_TRACER_") and name != "RELEVANCY_TRACER_CACHE_DIR":
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


def fake_model_settings(server: FakeOpenAIServer) -> dict[str, Any]:
    """Settings sending chat and embeddings to ``server`` (as arguments)."""
    return dict(llm="openai", embeddings="openai", llm_base_url=server.base_url, llm_model="fake-chat", embedding_model="fake-embed")


def fake_model_env(server: FakeOpenAIServer) -> dict[str, str]:
    """The same settings as ``RELEVANCY_TRACER_*`` environment variables (for subprocesses)."""
    return {"RELEVANCY_TRACER_" + name.upper(): value for name, value in fake_model_settings(server).items()}


def subprocess_env(*extra: dict, **more: str) -> dict[str, str]:
    """This process's environment without OTEL_*, OPENAI_*, PHOENIX_* and RELEVANCY_TRACER_*
    settings (the model cache directory is kept), plus ``extra``/``more``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELEVANCY_TRACER_", "OTEL_", "OPENAI_", "PHOENIX_")) or k == "RELEVANCY_TRACER_CACHE_DIR"}
    for mapping in extra:
        env.update(mapping)
    env.update(more)
    return env


def openai_settings(server: FakeOpenAIServer, **overrides: Any) -> Settings:
    """Settings that send chat and embeddings to ``server`` (fast retries, short timeouts).

    The method is ``ragas`` unless overridden: these tests exercise the RAGAS machinery
    (question generation, one embeddings request, noncommittal rules); the default method
    (``ragas_judge``) has tests of its own.
    """
    values: dict[str, Any] = dict(method="ragas", llm_timeout=5.0, llm_max_retries=2, **fake_model_settings(server))
    values.update(overrides)
    return Settings.resolve(**values)


@pytest.fixture
def engine(server: FakeOpenAIServer) -> Engine:
    return Engine(openai_settings(server))


# ------------------------------------------------------------------------------ tracing fixtures


@pytest.fixture(scope="session")
def otel():
    """Process-wide SDK providers with in-memory span exporter and metric reader (set once)."""
    from types import SimpleNamespace

    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from relevancy_tracer.otel.metrics import score_views

    resource = Resource.create({"service.name": "test-rag-app"})
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    ledger = SpanLedger()
    provider.add_span_processor(ledger)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader], views=score_views()))
    return SimpleNamespace(exporter=exporter, reader=reader, provider=provider, tracer=provider.get_tracer("tests"), ledger=ledger)


from opentelemetry.sdk.trace import SpanProcessor  # noqa: E402


class SpanLedger(SpanProcessor):
    """A span processor recording every start and end, to check each span ends exactly once."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.started: dict[int, str] = {}
        self.ended: dict[int, int] = {}

    def on_start(self, span, parent_context=None) -> None:
        with self.lock:
            self.started[span.context.span_id] = span.name

    def on_end(self, span) -> None:
        with self.lock:
            self.ended[span.context.span_id] = self.ended.get(span.context.span_id, 0) + 1
            self.changed.notify_all()

    def wait_ended(self, name: str, count: int = 1, timeout: float = 30.0) -> bool:
        """Block until ``count`` spans named ``name`` have ended; False on timeout."""
        with self.changed:
            return self.changed.wait_for(lambda: sum(1 for sid, n in self.started.items() if n == name and sid in self.ended) >= count, timeout)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def clear(self) -> None:
        with self.lock:
            self.started.clear()
            self.ended.clear()

    def check(self) -> None:
        """Every started span ended exactly once."""
        with self.lock:
            unended = {sid: name for sid, name in self.started.items() if sid not in self.ended}
            twice = {sid: n for sid, n in self.ended.items() if n != 1}
        assert not unended, f"spans never ended: {sorted(unended.values())}"
        assert not twice, f"spans ended more than once: {twice}"


@pytest.fixture
def tracing(otel, server):
    """``configure(**overrides)`` pointed at the fake model server; shut down after the test."""
    import relevancy_tracer

    otel.exporter.clear()
    otel.ledger.clear()

    def configure(**overrides: Any):
        # method ragas: one chat + one embeddings request per evaluation, easy to reason about
        values: dict[str, Any] = dict(method="ragas", llm_timeout=5.0, llm_max_retries=0, **fake_model_settings(server))
        values.update(overrides)
        return relevancy_tracer.configure(**values)

    configure()
    yield configure
    relevancy_tracer.shutdown(5.0)
    import gc

    gc.collect()  # streams left unconsumed end their spans when collected
    otel.ledger.check()
    otel.exporter.clear()


def finished_spans(otel, name=None):
    spans = otel.exporter.get_finished_spans()
    return [s for s in spans if name is None or s.name == name]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    """A Phoenix server (OTLP/HTTP and gRPC, REST API, UI) on free ports, one per test module."""
    from relevancy_tracer._phoenix_server import PhoenixServer, free_port

    server = PhoenixServer(free_port(), free_port(), tmp_path_factory.mktemp("phoenix"))
    server.start()
    yield server
    server.stop()
