"""Recorded agent libraries (issue 41): the OTLP exports of real instrumentation libraries, recorded
once by ``tests/sources/record.py`` from their pinned environments (``tests/sources/NAME.txt``)
and stored in ``tests/sources/recordings/``, replayed into a real in-process `serve` over
OTLP/HTTP in the order and with the content types they were sent. Each user-level call the app
made must be queued exactly once with the exact question (the last user turn) and the answer
the app got, read by the convention named; every span of the library that is not scored is
counted, by reason, exactly as listed.

Building the six environments live costs several minutes of CI each (the live matrix,
``tests/test_source_matrix.py``, keeps the most common sources); replaying costs seconds.
"""

from __future__ import annotations

import base64
import gzip
import json
import urllib.request
from typing import Any

import pytest

from .conftest import ROOT, openai_settings
from .test_service_faults import no_exports  # noqa: F401 - a fixture

RECORDINGS = ROOT / "tests" / "sources" / "recordings"

#: case -> (convention every call is read by, spans counted skipped by (source, reason), calls
#: counted skipped by the content join by reason, whether the multi-turn call carries its
#: earlier turns: the span read holds the conversation; an agent run that records only the new
#: turn, as Strands' invoke_agent and a smolagents run do, has none).
AGENTS_TOOL_TURN = {("openinference", "tool_call"): 1, ("openinference", "no_input"): 1}
EXPECTED: dict[str, tuple[str, dict[tuple[str, str], int], dict[str, int], bool]] = {
    # the root LangGraph chain: its input messages and its state's last message; every node,
    # routing edge (should_continue: "__end__") and model call inside covered
    "langgraph_react_batch": ("openinference", {}, {}, True),
    "langgraph_react_simple": ("openinference", {}, {}, True),
    # the run's root holds no input: the last response with text is the call; the tool-call
    # response and the turn around it (no input) are counted
    "openai_agents_streamed": ("openinference", AGENTS_TOOL_TURN, {}, True),
    "openai_agents_streamed_simple": ("openinference", AGENTS_TOOL_TURN, {}, True),
    "openai_agents_chat_streamed": ("openinference", AGENTS_TOOL_TURN, {}, True),
    # ToolCallingAgent.run: {"task"} in, the final answer out; one call per run (3 runs)
    "smolagents_batch": ("openinference", {}, {}, False),
    "smolagents_simple": ("openinference", {}, {}, False),
    # autolog alone: each completion is its own trace, the tool-call one counted
    "mlflow_autolog": ("mlflow", {("mlflow", "tool_call"): 1}, {}, True),
    "mlflow_traced": ("mlflow", {}, {}, True),
    # the invoke_agent root's span events
    "strands_default": ("genai", {}, {}, False),
    "strands_latest": ("genai", {}, {}, False),
    # log events (JSON-string bodies) joined to each chat span; the tool-call turn skipped
    "semantic_kernel": ("genai-events", {}, {"tool_call": 1}, True),
}
HISTORY = [{"role": "user", "content": "Where is Lyon?"}, {"role": "assistant", "content": "Lyon is in France."}]


def recording(case: str) -> dict[str, Any]:
    """A recording as ``tests/sources/record.py`` wrote it."""
    with gzip.open(RECORDINGS / f"{case}.json.gz", "rt", encoding="utf-8") as handle:
        return json.load(handle)


def replay(case: str, server: Any) -> tuple[list[Any], Any]:
    """Send a recording's export requests to a fresh in-process `serve`; every call decided
    (``flush``). Returns the candidates queued and the (stopped) service."""
    from relevancy_tracer.service import ScoringService

    document = recording(case)
    service = ScoringService(openai_settings(server, decision_wait=30.0), http_port=0, grpc_port=None).start()
    queued: list[Any] = []
    offer = service._offer
    service._offer = lambda candidates: offer(candidates) and not queued.extend(candidates)  # type: ignore
    try:
        for request in document["requests"]:
            headers = {"Content-Type": request["content_type"]}
            if request["content_encoding"]:
                headers["Content-Encoding"] = request["content_encoding"]
            sent = urllib.request.Request(
                f"http://127.0.0.1:{service.server.http_port}{request['path']}",
                data=base64.b64decode(request["body"]),
                headers=headers,
            )
            with urllib.request.urlopen(sent, timeout=30) as reply:
                assert reply.status == 200
        assert service.flush(60)
    finally:
        service.stop(10)
    return queued, service


def test_every_recording_is_checked_and_names_its_pinned_library():
    """Each recording in ``tests/sources/recordings`` has its expectations here, and was made
    in the environment its pins file names (the pinned library's version is in its freeze)."""
    cases = sorted(path.name[: -len(".json.gz")] for path in RECORDINGS.glob("*.json.gz"))
    assert cases == sorted(EXPECTED)
    for case in cases:
        document = recording(case)
        pins = (ROOT / "tests" / "sources" / f"{document['environment']}.txt").read_text(encoding="utf-8").split()
        name, version = pins[0].split("==")
        library = name.split("[")[0] + "==" + version
        assert library.lower() in [line.lower() for line in document["versions"]], (case, library)
        assert document["calls"] and all(
            call["trace_id"] and call["question"] and call["answer"] for call in document["calls"]
        )


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_recorded_library_is_scored_once_per_call_with_its_question_and_answer(case, server, no_exports):
    convention, skipped, join_skipped, history = EXPECTED[case]
    queued, service = replay(case, server)
    calls = recording(case)["calls"]
    assert sorted((c.span.trace_id, c.question, c.answer) for c in queued) == sorted(
        (c["trace_id"], c["question"], c["answer"]) for c in calls
    ), service.window.outcomes if service.window else None
    assert {c.convention for c in queued} == {convention}
    assert service.skipped_spans == skipped
    assert service.skipped == join_skipped
    assert service.join.expired == {}
    histories = {c.question: c.history for c in queued}
    assert histories["On which river is Lyon?"] == (HISTORY if history else [])
    assert histories["What is the weather in Lyon?"] == []
