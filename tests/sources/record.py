"""Record the OTLP exports of real agent libraries, for ``tests/test_recorded_sources.py`` (issue 41).

Building six more pinned environments live on every CI run would cost minutes each; instead
this script builds each library's pinned venv (``tests/sources/NAME.txt``, the same cache as
the live matrix, ``~/.cache/relevancy-tracer/sources``), runs ``tests/sources/agent_app.py`` in
it against :class:`AgentModel` (a scripted OpenAI-compatible model that calls a tool when asked
about the weather, over chat completions and the Responses API, streamed or not), and stores
the export requests exactly as the library sent them (protobuf or JSON bodies, traces and
logs, in arrival order) with what the app says each user-level call was (its trace id,
question and the answer it got) in ``tests/sources/recordings/CASE.json.gz``.

Run from the repository root with the project's venv::

    python -m tests.sources.record                 # every case
    python -m tests.sources.record strands_default  # some cases

The recordings are real library output: nothing here writes or edits a span.
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

SOURCES = Path(__file__).resolve().parent
RECORDINGS = SOURCES / "recordings"

#: The conversations every app holds: a one-turn question the model answers with a tool, and a
#: multi-turn conversation (its last user turn is the question).
CONVERSATIONS = [
    [{"role": "user", "content": "What is the weather in Lyon?"}],
    [
        {"role": "user", "content": "Where is Lyon?"},
        {"role": "assistant", "content": "Lyon is in France."},
        {"role": "user", "content": "On which river is Lyon?"},
    ],
]
ANSWERS = {
    "What is the weather in Lyon?": "It is sunny and 21 C in Lyon.",
    "Where is Lyon?": "Lyon is in France.",
    "On which river is Lyon?": "Lyon is on the Rhone.",
}
TOOL_RESULT = "sunny, 21 C"

#: case -> (environment pins name, app mode, extra environment). Each case is one run of
#: ``agent_app.py`` with SOURCE=case.
CASES: dict[str, tuple[str, dict[str, str]]] = {
    "langgraph_react_batch": ("langgraph_react", {"PROCESSOR": "batch"}),
    "langgraph_react_simple": ("langgraph_react", {"PROCESSOR": "simple"}),
    "openai_agents_streamed": ("openai_agents", {"PROCESSOR": "batch"}),
    "openai_agents_streamed_simple": ("openai_agents", {"PROCESSOR": "simple"}),
    "openai_agents_chat_streamed": ("openai_agents", {"PROCESSOR": "batch"}),
    "smolagents_batch": ("smolagents", {"PROCESSOR": "batch"}),
    "smolagents_simple": ("smolagents", {"PROCESSOR": "simple"}),
    "mlflow_autolog": ("mlflow_tracing", {}),
    "mlflow_traced": ("mlflow_tracing", {}),
    "strands_default": ("strands", {"PROCESSOR": "batch"}),
    "strands_latest": (
        "strands",
        {"PROCESSOR": "simple", "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"},
    ),
    "semantic_kernel": (
        "semantic_kernel",
        {"PROCESSOR": "batch", "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE": "true"},
    ),
}


def _question_and_tool(texts: list[tuple[str, str]]) -> tuple[Optional[str], bool]:
    """The question a conversation asks (the known question last mentioned outside system
    messages) and whether a tool result came after it."""
    question, position = None, -1
    for i, (role, text) in enumerate(texts):
        if role == "system":
            continue
        for known in ANSWERS:
            if known in text and (question is None or i >= position):
                question, position = known, i
    tooled = any(
        TOOL_RESULT in text or role == "tool"
        for i, (role, text) in enumerate(texts)
        if i > position and role != "system"
    )
    return question, tooled


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text(part.get("text") or part.get("content") or part.get("output") or "")
            if isinstance(part, dict)
            else str(part)
            for part in content
        )
    return "" if content is None else json.dumps(content)


class AgentModel:
    """A scripted OpenAI-compatible model for agents, on 127.0.0.1 and a free port.

    The reply to a conversation: for the weather question, a ``get_weather`` tool call when the
    request offers that tool and no tool result came yet, else the answer of :data:`ANSWERS`;
    when the request offers a ``final_answer`` tool (smolagents), the answer is that tool's
    call. Chat completions (``/chat/completions``, streamed or not) and the Responses API
    (``/responses``, streamed or not).
    """

    def __init__(self) -> None:
        owner = self
        self.requests: list[tuple[str, dict]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._json({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                path = self.path.rstrip("/")
                owner.requests.append((path, body))
                if path.endswith("/chat/completions"):
                    owner.chat(self, body)
                elif path.endswith("/responses"):
                    owner.responses(self, body)
                else:
                    self._json({"error": {"message": f"unknown path {path}"}}, 404)

            def _json(self, body: Any, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _events(self, events: list[tuple[Optional[str], Any]]) -> None:
                data = "".join(
                    (f"event: {name}\n" if name else "")
                    + f"data: {json.dumps(event) if not isinstance(event, str) else event}\n\n"
                    for name, event in events
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._ids = 0

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _id(self) -> int:
        self._ids += 1
        return self._ids

    @staticmethod
    def _tools(body: dict) -> set[str]:
        names = set()
        for tool in body.get("tools") or []:
            if isinstance(tool, dict):
                names.add(str((tool.get("function") or {}).get("name") or tool.get("name") or ""))
        return names

    def decide(self, texts: list[tuple[str, str]], tools: set[str]) -> tuple[str, Optional[tuple[str, dict]]]:
        """(answer text, tool call (name, arguments) or None) for a conversation."""
        question, tooled = _question_and_tool(texts)
        answer = ANSWERS.get(question or "", "I do not know.")
        weather = next((name for name in sorted(tools) if name.endswith("get_weather")), None)
        if question == "What is the weather in Lyon?" and not tooled and weather:
            return "", (weather, {"city": "Lyon"})
        if "final_answer" in tools:
            return "", ("final_answer", {"answer": answer})
        return answer, None

    def chat(self, handler: Any, body: dict) -> None:
        texts = [
            (
                str(m.get("role")),
                _text(m.get("content"))
                + "".join(_text(c.get("function", {}).get("arguments")) for c in m.get("tool_calls") or []),
            )
            for m in body.get("messages") or []
            if isinstance(m, dict)
        ]
        text, call = self.decide(texts, self._tools(body))
        n = self._id()
        base = {"id": f"chatcmpl-{n}", "created": int(time.time()), "model": body.get("model", "gpt-4o-mini")}
        usage = {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28}
        calls = (
            [
                {
                    "index": 0,
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": call[0], "arguments": json.dumps(call[1])},
                }
            ]
            if call
            else None
        )
        finish = "tool_calls" if call else "stop"
        if not body.get("stream"):
            message = {
                "role": "assistant",
                "content": text or None,
                **({"tool_calls": [{k: v for k, v in c.items() if k != "index"} for c in calls]} if calls else {}),
            }
            handler._json(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )
            return
        chunk = {**base, "object": "chat.completion.chunk"}
        events: list[tuple[Optional[str], Any]] = [
            (
                None,
                {
                    **chunk,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                },
            )
        ]
        if text:
            for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                events.append(
                    (None, {**chunk, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                )
        if calls:
            events.append(
                (None, {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
            )
        events.append((None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append((None, {**chunk, "choices": [], "usage": usage}))
        events.append((None, "[DONE]"))
        handler._events(events)

    def responses(self, handler: Any, body: dict) -> None:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        texts = []
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call_output":
                texts.append(("tool", _text(item.get("output"))))
            elif item.get("type") == "function_call":
                texts.append(("assistant", _text(item.get("arguments"))))
            else:
                texts.append((str(item.get("role")), _text(item.get("content"))))
        text, call = self.decide(texts, self._tools(body))
        n = self._id()
        if call:
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": call[0],
                    "arguments": json.dumps(call[1]),
                    "status": "completed",
                }
            ]
        else:
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model", "gpt-4o-mini"),
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": 20,
                "output_tokens": 8,
                "total_tokens": 28,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        if not body.get("stream"):
            handler._json(response)
            return
        seq = iter(range(1000))
        events: list[tuple[Optional[str], Any]] = []

        def add(kind: str, **fields: Any) -> None:
            events.append((kind, {"type": kind, "sequence_number": next(seq), **fields}))

        add("response.created", response={**response, "status": "in_progress", "output": []})
        item = output[0]
        if call:
            add("response.output_item.added", output_index=0, item={**item, "arguments": "", "status": "in_progress"})
            add("response.function_call_arguments.delta", output_index=0, item_id=item["id"], delta=item["arguments"])
            add(
                "response.function_call_arguments.done", output_index=0, item_id=item["id"], arguments=item["arguments"]
            )
        else:
            add("response.output_item.added", output_index=0, item={**item, "content": [], "status": "in_progress"})
            add(
                "response.content_part.added",
                output_index=0,
                item_id=item["id"],
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
            for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                add(
                    "response.output_text.delta",
                    output_index=0,
                    item_id=item["id"],
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            add(
                "response.output_text.done", output_index=0, item_id=item["id"], content_index=0, text=text, logprobs=[]
            )
            add(
                "response.content_part.done",
                output_index=0,
                item_id=item["id"],
                content_index=0,
                part=item["content"][0],
            )
        add("response.output_item.done", output_index=0, item=item)
        add("response.completed", response=response)
        handler._events(events)


class Recorder:
    """An OTLP/HTTP receiver on 127.0.0.1 that answers every export with success and keeps each
    ``/v1/traces`` and ``/v1/logs`` request as it came (path, content type and encoding, body);
    ``/v1/metrics`` are answered and not kept (``serve`` discards them)."""

    def __init__(self) -> None:
        owner = self
        self.requests: list[dict] = []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    body = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        body += self.rfile.read(size)
                        self.rfile.readline()
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                content_type = self.headers.get("Content-Type") or ""
                if self.path in ("/v1/traces", "/v1/logs"):
                    with owner.lock:
                        owner.requests.append(
                            {
                                "path": self.path,
                                "content_type": content_type,
                                "content_encoding": self.headers.get("Content-Encoding") or "",
                                "body": base64.b64encode(body).decode("ascii"),
                            }
                        )
                payload = b"{}" if "json" in content_type else b""
                self.send_response(200)
                self.send_header(
                    "Content-Type", "application/json" if "json" in content_type else "application/x-protobuf"
                )
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def environment_python(name: str) -> str:
    """The python of the venv pinned by ``tests/sources/<name>.txt``, built once under the live
    matrix's cache (``tests/test_source_matrix.py`` keys it alike: the pins' and Python's hash)."""
    import hashlib
    import shutil

    pins = SOURCES / f"{name}.txt"
    key = hashlib.sha256(pins.read_bytes() + sys.version.encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relevancy-tracer" / "sources"
    directory = cache / f"{name}-{key}"
    if not (directory / ".built").exists():
        shutil.rmtree(directory, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True, timeout=300)
        python = str(directory / "bin" / "python")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(pins)],
            check=True,
            timeout=1800,
        )
        subprocess.run([python, "-m", "pip", "check"], check=True, timeout=120)
        (directory / ".built").touch()
    return str(directory / "bin" / "python")


def record(case: str) -> Path:
    """Run one case's app against :class:`AgentModel` and a :class:`Recorder`; write its
    recording and return its path."""
    environment, extra = CASES[case]
    python = environment_python(environment)
    model, recorder = AgentModel(), Recorder()
    try:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OTEL_", "OPENAI_", "RELEVANCY_TRACER_", "MLFLOW_", "PYTHON"))
        }
        env.pop("VIRTUAL_ENV", None)
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=recorder.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRICS_EXPORTER="none",
            SOURCE=case,
            OPENAI_API_KEY="unused",
            OPENAI_BASE_URL=model.base_url,
            **extra,
        )
        if environment == "mlflow_tracing":  # MLflow exports over OTLP when this is set
            # (a tracking URI is needed: without one mlflow-tracing looks for a local file store,
            # whose modules are not in the mlflow-tracing package; traces go to OTLP only). Not the
            # generic OTEL_EXPORTER_OTLP_ENDPOINT: with it MLflow also exports metrics, and its
            # span ending fails in mlflow-tracing (a tracking-store name is not defined)
            env.pop("OTEL_EXPORTER_OTLP_ENDPOINT")
            env.update(
                OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=recorder.endpoint + "/v1/traces",
                OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
                MLFLOW_TRACKING_URI=recorder.endpoint,
            )
        with tempfile.TemporaryDirectory() as cwd:  # an empty directory: MLflow looks for ./mlruns
            proc = subprocess.run(
                [python, str(SOURCES / "agent_app.py"), model.base_url, json.dumps(CONVERSATIONS)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                cwd=cwd,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"{case}: the app failed\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        calls = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        model.close()
        recorder.close()
    versions = subprocess.run(
        [python, "-m", "pip", "freeze", "--disable-pip-version-check"], capture_output=True, text=True, timeout=120
    ).stdout.split()
    RECORDINGS.mkdir(exist_ok=True)
    out = RECORDINGS / f"{case}.json.gz"
    document = {
        "case": case,
        "environment": environment,
        "settings": extra,
        "calls": calls,
        "requests": recorder.requests,
        "model_requests": len(model.requests),
        "versions": versions,
    }
    with gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as handle:
        handle.write(json.dumps(document, sort_keys=True).encode("utf-8"))
    return out


def main(argv: list[str]) -> None:
    for case in argv or list(CASES):
        path = record(case)
        document = json.loads(gzip.open(path, "rt", encoding="utf-8").read())
        print(
            f"{case}: {len(document['requests'])} export requests, "
            f"calls {[(c['question'], c['answer']) for c in document['calls']]} -> {path}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
