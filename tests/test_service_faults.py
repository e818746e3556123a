"""The scoring service's receiver under hostile input and faults (issue 22): every request is
answered with a status and a message, the process stays up with bounded memory and threads,
nothing accepted is lost, and only holders of the token get in.

Real components on 127.0.0.1: a ``relevancy-tracer serve`` process (the scripted model server as
its judge, an OTLP receiver as its backend), raw sockets for what no well-behaved client sends,
grpcio clients, and hypothesis-generated OTLP/JSON and protobuf bodies.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from relevancy_tracer._phoenix_server import free_port
from relevancy_tracer.otel import attributes as A
from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver

from ._observability import wait_until
from .conftest import ROOT, fake_model_env, openai_settings, subprocess_env

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BYTES = 4 * 1024 * 1024  # the serve process's max_request_bytes
TRACES = "opentelemetry.proto.collector.trace.v1.TraceService/Export"


# ------------------------------------------------------------------------------ request builders


def kv(key: str, value: Any) -> Any:
    from opentelemetry.proto.common.v1 import common_pb2

    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def chain_span(question: str, answer: str, trace_id: Optional[bytes] = None, span_id: Optional[bytes] = None, parent: bytes = b"", **extra: str) -> Any:
    from opentelemetry.proto.trace.v1 import trace_pb2

    attributes = [kv("openinference.span.kind", "CHAIN"), kv("input.value", question), kv("output.value", answer)] + [kv(k.replace("_", "."), v) for k, v in extra.items()]
    return trace_pb2.Span(trace_id=os.urandom(16) if trace_id is None else trace_id, span_id=os.urandom(8) if span_id is None else span_id, parent_span_id=parent, name="answer", attributes=attributes)


def export_request(*spans: Any) -> Any:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=list(spans))])])


def otlp_json(request: Any) -> bytes:
    """OTLP/JSON of a request: protobuf's JSON mapping with hex trace and span ids."""
    import base64

    from google.protobuf import json_format

    data = json_format.MessageToDict(request)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(data).encode()


def evaluations_of(spans: list[dict]) -> dict[tuple[str, str], dict]:
    """Evaluator spans by the (trace id, span id) they scored."""
    return {(s["trace_id"], s["parent_span_id"]): s for s in spans if s["attributes"].get(A.OPENINFERENCE_SPAN_KIND) == A.SPAN_KIND_EVALUATOR}


# ------------------------------------------------------------------------------ a running `serve`


class Serve:
    """``relevancy-tracer serve`` in a subprocess, with helpers to talk to it."""

    def __init__(self, proc: subprocess.Popen, http_port: int, grpc_port: int, log: Path, tls_ca: Optional[str] = None):
        self.proc, self.http_port, self.grpc_port, self.log, self.tls_ca = proc, http_port, grpc_port, log, tls_ca

    def post(self, body: bytes, headers: Optional[dict] = None, path: str = "/v1/traces", timeout: float = 30.0) -> tuple[int, dict, bytes]:
        """(status, headers, body) of one POST over a new connection."""
        all_headers = {"Content-Type": "application/x-protobuf", **AUTH, **(headers or {})}
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            connection.request("POST", path, body=body, headers=all_headers)
            reply = connection.getresponse()
            return reply.status, dict(reply.headers), reply.read()
        finally:
            connection.close()

    def raw(self, data: bytes, timeout: float = 10.0) -> bytes:
        """Send ``data`` on a fresh socket and read until the server closes or a full response
        with Content-Length arrived."""
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=timeout) as sock:
            sock.sendall(data)
            return read_response(sock)

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss

    def alive(self) -> bool:
        return self.proc.poll() is None


def read_response(sock: socket.socket) -> bytes:
    """Bytes of one HTTP response (head and Content-Length body) or until the peer closes."""
    data = b""
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:] if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(rest) >= length:
                return data
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return data
        if not chunk:
            return data
        data += chunk


def start_serve(tmp: Path, model: FakeOpenAIServer, backend: OTLPReceiver, *args: str, **env: str) -> Serve:
    http_port, grpc_port = free_port(), free_port()
    log = tmp / f"serve-{http_port}.log"
    environment = subprocess_env(
        fake_model_env(model),
        dict(
            RELEVANCY_TRACER_METHOD="ragas",
            RELEVANCY_TRACER_SERVICE_TOKEN=TOKEN,
            RELEVANCY_TRACER_MAX_REQUEST_BYTES=str(MAX_BYTES),
            OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRICS_EXPORTER="none",
            OTEL_BSP_SCHEDULE_DELAY="200",
        ),
        env,
    )
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "serve", "--http-port", str(http_port), "--grpc-port", str(grpc_port), *args]
    proc = subprocess.Popen(command, env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    serve = Serve(proc, http_port, grpc_port, log)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited: {log.read_text()[-3000:]}")
        return "OTLP/HTTP" in log.read_text()

    wait_until(ready, 60, "serve to listen")
    return serve


def stop_serve(serve: Serve) -> str:
    serve.proc.terminate()
    try:
        serve.proc.wait(30)
    except subprocess.TimeoutExpired:
        serve.proc.kill()
        serve.proc.wait(10)
    return serve.log.read_text()


@pytest.fixture(scope="module")
def model() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture(scope="module")
def backend() -> Iterator[OTLPReceiver]:
    with OTLPReceiver(grpc=False) as receiver:
        yield receiver


@pytest.fixture(scope="module")
def serve(model, backend, tmp_path_factory) -> Iterator[Serve]:
    running = start_serve(tmp_path_factory.mktemp("serve"), model, backend)
    yield running
    output = stop_serve(running)
    assert "Traceback" not in output, output[-5000:]


def assert_status(reply: tuple[int, dict, bytes], status: int, words: str = "") -> dict:
    """The reply has ``status`` and a google.rpc.Status message mentioning ``words``; returns it."""
    from google.protobuf import json_format
    from google.rpc import status_pb2

    code, headers, body = reply
    assert code == status, (code, body[:500])
    message = status_pb2.Status()
    if "json" in headers.get("Content-Type", ""):
        json_format.Parse(body, message)
    else:
        message.ParseFromString(body)
    assert message.message and words.lower() in message.message.lower(), message
    return {"code": message.code, "message": message.message}


# ------------------------------------------------------------------------------ HTTP framing


def test_a_chunked_body_is_read_and_its_span_scored(serve, backend):
    span = chain_span("Where is Lyon?", "Lyon is in France.")
    body = export_request(span).SerializeToString()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    reply = serve.raw(head + chunks)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    key = (span.trace_id.hex(), span.span_id.hex())
    spans = backend.wait_for_spans(lambda s: key in evaluations_of(s), timeout=30)
    assert evaluations_of(spans)[key]["attributes"][A.STATUS] == "scored"  # queued, not silently lost


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3", b"99999999999999999999999"])
def test_a_bad_content_length_gets_400_with_a_message(serve, length):
    reply = serve.raw(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: " + length + b"\r\n\r\nabc")
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.split(b" ")[1] == b"400", reply[:300]
    assert b"Content-Length" in rest.partition(b"\r\n\r\n")[2], reply  # a message, not an empty answer
    assert serve.alive()


def test_a_body_above_max_request_bytes_gets_413_before_it_is_read(serve):
    reply = serve.post(b"\0" * (MAX_BYTES + 1))
    assert_status(reply, 413, "max_request_bytes")


def test_a_gzip_bomb_is_stopped_at_the_bound(serve):
    """1 MiB of gzip inflating to 1 GiB: 413 once the inflated size passes max_request_bytes,
    the process's memory stays bounded."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1 << 20)
    bomb = b"".join(compressor.compress(zeros) for _ in range(1024)) + compressor.flush()
    assert len(bomb) < 2 * (1 << 20)
    before = serve.rss()
    for _ in range(3):
        assert_status(serve.post(bomb, {"Content-Encoding": "gzip"}), 413, "decompressed")
    assert serve.alive() and serve.rss() - before < 100 * (1 << 20)
    assert_status(serve.post(b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}), 400, "gzip")
    assert_status(serve.post(b"x", {"Content-Encoding": "br"}), 415, "content-encoding")


# ------------------------------------------------------------------------------ bodies


@pytest.mark.parametrize(
    "body, words",
    [
        (b"[1,2,3]", "JSON object"),
        (b'"a string"', "JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "deeply"),
        (b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeply"),
        (b'{"resourceSpans": 5}', "resourceSpans"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "hex"),
        (b"\xff\xfe not json", "JSON"),
    ],
)
def test_json_that_is_not_an_export_request_gets_400_with_a_message(serve, body, words):
    assert_status(serve.post(body, {"Content-Type": "application/json"}), 400, words)


def test_a_deeply_nested_attribute_costs_only_its_own_span(serve, backend):
    """input.value = "[" * 100000 used to lose the whole batch with no response."""
    bad = chain_span("[" * 100_000, "[" * 100_000)
    good = chain_span("Where is Nice?", "Nice is in France.")
    nested = chain_span('{"question": ' * 5000, "Fine.")
    reply = serve.post(export_request(bad, nested, good).SerializeToString())
    assert reply[0] == 200
    key = (good.trace_id.hex(), good.span_id.hex())
    spans = backend.wait_for_spans(lambda s: key in evaluations_of(s), timeout=30)
    assert evaluations_of(spans)[key]["attributes"][A.STATUS] == "scored"


def test_spans_with_invalid_ids_are_rejected_for_good_with_partial_success(serve):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    spans = [chain_span("Where is Metz?", "In France."), chain_span("q?", "a.", trace_id=b"\1" * 8), chain_span("q?", "a.", span_id=b"\0" * 8)]
    status, headers, body = serve.post(export_request(*spans).SerializeToString())
    response = ExportTraceServiceResponse.FromString(body)
    assert status == 200 and response.partial_success.rejected_spans == 2 and "span id" in response.partial_success.error_message
    status, _, body = serve.post(otlp_json(export_request(*spans)), {"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["partialSuccess"]["rejectedSpans"] == "2"


def test_a_large_attribute_is_cut_to_the_content_limits(serve, model):
    """A 3 MB answer is accepted (below the byte limit) and cut before it is parsed or scored."""
    reply = serve.post(export_request(chain_span("Where is Brest, in the far west?", "Brest is in Brittany. " * 140_000)).SerializeToString())
    assert reply[0] == 200
    prompts = wait_until(lambda: [p for p in (json.dumps(r["messages"]) for r in model.requests_to("chat")) if "Brest is in Brittany." in p], 30, "the scoring of the large span")
    assert max(len(p) for p in prompts) < 40_000


# ------------------------------------------------------------------------------ gRPC


def grpc_call(serve: Serve, body: bytes, metadata: tuple = (("authorization", f"Bearer {TOKEN}"),), credentials: Any = None, compression: Any = None) -> Any:
    """Raw OTLP/gRPC Export of ``body``: (status code, details, response bytes)."""
    import grpc

    target = f"127.0.0.1:{serve.grpc_port}"
    channel = grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "localhost")]) if credentials else grpc.insecure_channel(target)
    try:
        call = channel.unary_unary("/" + TRACES, request_serializer=None, response_deserializer=None)
        try:
            return grpc.StatusCode.OK, "", call(body, metadata=metadata, timeout=30, compression=compression)
        except grpc.RpcError as exc:
            return exc.code(), exc.details(), b""
    finally:
        channel.close()


def test_grpc_answers_invalid_argument_for_undecodable_requests_and_resource_exhausted_above_the_limit(serve):
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    code, details, _ = grpc_call(serve, b"\xff\xff\xff not protobuf")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "protobuf" in details
    oversized = export_request(chain_span("q?", "a" * (MAX_BYTES + 10))).SerializeToString()
    assert grpc_call(serve, oversized)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_call(serve, oversized, compression=grpc.Compression.Gzip)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED  # ~5 KB on the wire
    code, _, body = grpc_call(serve, export_request(chain_span("[" * 100_000, "a."), chain_span("q?", "a.", trace_id=b"")).SerializeToString())
    assert code == grpc.StatusCode.OK and ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 1
    assert serve.alive()


def stalled_calls(port: int, count: int, metadata: tuple) -> tuple[Any, threading.Event, list]:
    """``count`` OTLP/gRPC Export calls that open and never send their message (the request
    iterator blocks until the returned event is set): (channel, release event, call futures)."""
    import grpc

    release = threading.Event()

    def never() -> Iterator[bytes]:
        release.wait(120)
        return
        yield b""  # a generator

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stall = channel.stream_unary("/" + TRACES, request_serializer=None, response_deserializer=None)
    return channel, release, [stall.future(never(), metadata=metadata, timeout=60) for _ in range(count)]


def test_grpc_calls_that_never_send_their_message_block_nothing(serve):
    """Issue 35, item 2: 12 unauthenticated gRPC calls that open and never send their message
    (more than the 8 decoding slots) are refused UNAUTHENTICATED from their metadata, before
    any message is read, and an authenticated call is served while they hang."""
    import grpc

    channel, release, stalled = stalled_calls(serve.grpc_port, 12, (("authorization", "Bearer wrong"),))
    try:
        body = export_request(chain_span("Is the gRPC receiver blocked?", "No.")).SerializeToString()
        assert grpc_call(serve, body)[0] == grpc.StatusCode.OK
        for call in stalled:
            assert call.exception(30).code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        release.set()
        channel.close()
    assert serve.alive()


def test_an_authenticated_grpc_call_whose_message_never_arrives_is_cut_at_the_body_timeout(no_exports):
    """A trusted sender's stalled calls hold a decoding slot for ``body_timeout`` at most
    (DEADLINE_EXCEEDED from the server, not the client's deadline), then a call is served;
    no thread is held per waiting call."""
    import grpc

    from relevancy_tracer.service.receiver import Admission, OTLPServer, ReceiverLimits

    server = OTLPServer(lambda request: Admission(True), http_port=None, grpc_port=0, token=TOKEN, limits=ReceiverLimits(body_timeout=1.0, max_inflight=2)).start()
    channel, release, stalled = stalled_calls(server.grpc_port, 6, (("authorization", f"Bearer {TOKEN}"),))
    try:
        codes = [call.exception(30).code() for call in stalled]
        # two hold the slots until the body timeout; the others wait for a slot as long
        assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE} and grpc.StatusCode.DEADLINE_EXCEEDED in codes, codes
        body = export_request(chain_span("q?", "a.")).SerializeToString()
        call = channel.unary_unary("/" + TRACES, request_serializer=None, response_deserializer=None)
        assert call(body, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10) == b""
    finally:
        release.set()
        channel.close()
        server.stop(1.0)


def _length_delimited(field: int, payload: bytes) -> bytes:
    """One protobuf field of wire type 2 (length-delimited)."""
    size, varint = len(payload), bytearray()
    while True:
        varint.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    return bytes([(field << 3) | 2]) + bytes(varint) + payload


def _span_flood(limit: int, span: bytes) -> bytes:
    """An ExportTraceServiceRequest of ``limit`` bytes at most: one resource and scope holding
    as many copies of the encoded ``span`` as fit."""
    item = _length_delimited(2, span)
    return _length_delimited(1, _length_delimited(2, item * ((limit - 64) // len(item))))


def test_concurrent_requests_of_millions_of_tiny_spans_stay_within_the_decoding_budget(model, backend, tmp_path):
    """Issue 35, item 3, at full size (max_request_bytes 16 MiB, the default): 8 concurrent
    requests of 559k spans without attributes (3.1 GB of RSS before), then 8 of 8.4M empty spans
    and 8 OTLP/JSON bodies of 5.6M ``{}``. The decoding memory of requests in flight is held
    against a budget of 32 x max_request_bytes: a request waits for room (503 with Retry-After
    after body_timeout), one that would not fit alone is refused for good (413). Peak RSS
    stays under its start + the budget + the bodies being read (8 x 2 x 16 MiB)."""
    import psutil

    limit = 16 * 1024 * 1024
    serve = start_serve(tmp_path, model, backend, RELEVANCY_TRACER_MAX_REQUEST_BYTES=str(limit), RELEVANCY_TRACER_RECEIVER_BODY_TIMEOUT="5")
    process = psutil.Process(serve.proc.pid)
    start = process.memory_info().rss
    peak, watching = [start], threading.Event()

    def watch() -> None:  # samples RSS while the requests run
        while not watching.wait(0.02):
            peak[0] = max(peak[0], process.memory_info().rss)

    threading.Thread(target=watch, daemon=True).start()
    from opentelemetry.proto.trace.v1 import trace_pb2

    minimal = _span_flood(limit, trace_pb2.Span(trace_id=b"t" * 16, span_id=b"s" * 8).SerializeToString())
    empty = _span_flood(limit, b"")
    flood = b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b",".join([b"{}"] * ((limit - 100) // 3)) + b"]}]}]}"
    try:
        for body, content_type, allowed in ((minimal, "application/x-protobuf", {200, 503}), (empty, "application/x-protobuf", {413}), (flood, "application/json", {413})):
            replies: list = []
            posts = [threading.Thread(target=lambda: replies.append(serve.post(body, {"Content-Type": content_type}, timeout=120))) for _ in range(8)]
            for post in posts:
                post.start()
            for post in posts:
                post.join(180)
            statuses = sorted(status for status, _, _ in replies)
            assert len(statuses) == 8 and set(statuses) <= allowed, statuses
            assert all(headers.get("Retry-After") == "1" for status, headers, _ in replies if status == 503)
            if 200 in allowed:
                assert 200 in statuses
            else:
                assert all(b"decoding budget" in reply for _, _, reply in replies)
    finally:
        watching.set()
        output = stop_serve(serve)
    assert peak[0] - start < 512 * 2**20 + 8 * 2 * limit, f"peak RSS {peak[0] >> 20} MiB from {start >> 20} MiB"
    assert "Traceback" not in output, output[-3000:]


# ------------------------------------------------------------------------------ authentication


def test_requests_without_the_token_get_401_and_unauthenticated(serve):
    import grpc

    body = export_request(chain_span("q?", "a.")).SerializeToString()
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        status, reply_headers, _ = reply = serve.post(body, headers)
        assert_status(reply, 401, "token")
        assert reply_headers["WWW-Authenticate"] == "Bearer"
    assert serve.post(body)[0] == 200
    assert grpc_call(serve, body, metadata=())[0] == grpc.StatusCode.UNAUTHENTICATED
    assert grpc_call(serve, body, metadata=(("authorization", "Bearer wrong"),))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert grpc_call(serve, body)[0] == grpc.StatusCode.OK


def test_an_otel_exporter_authenticates_with_otel_exporter_otlp_headers(serve, backend):
    script = (
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter\n"
        "p = TracerProvider(); p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter())); t = p.get_tracer('app')\n"
        "with t.start_as_current_span('rag') as s:\n"
        "    s.set_attribute('openinference.span.kind', 'CHAIN'); s.set_attribute('input.value', 'Where is Caen?'); s.set_attribute('output.value', 'Caen is in Normandy.')\n"
        "    print(format(s.get_span_context().trace_id, '032x'), format(s.get_span_context().span_id, '016x'))\n"
        "p.shutdown()\n"
    )
    env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{serve.http_port}", OTEL_EXPORTER_OTLP_HEADERS=f"Authorization=Bearer%20{TOKEN}")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    key = tuple(proc.stdout.split())
    assert key in evaluations_of(backend.wait_for_spans(lambda s: key in evaluations_of(s), timeout=30))


def test_serve_on_a_public_address_without_a_token_refuses_to_start(no_exports):
    from relevancy_tracer.config import Settings
    from relevancy_tracer.service import ScoringService

    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "serve", "--host", "0.0.0.0", "--http-port", "0", "--grpc-port", "0", "--llm", "openai", "--embeddings", "openai"]
    proc = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "RELEVANCY_TRACER_SERVICE_TOKEN" in proc.stderr and "--allow-unauthenticated" in proc.stderr
    settings = Settings.resolve(llm="openai", embeddings="openai")
    for host in ("0.0.0.0", "::", "10.1.2.3", "scoring.internal"):
        with pytest.raises(ValueError, match="service token"):
            ScoringService(settings, host=host, http_port=None, grpc_port=None)
    for host, overrides, allow in (("127.0.0.1", {}, False), ("localhost", {}, False), ("::1", {}, False), ("0.0.0.0", {"service_token": "t"}, False), ("0.0.0.0", {}, True)):
        ScoringService(settings.replace(**overrides), host=host, http_port=None, grpc_port=None, allow_unauthenticated=allow).stop(1)  # constructed: allowed


def test_serve_takes_its_connection_bounds_from_the_environment(model, backend, tmp_path):
    """RELEVANCY_TRACER_RECEIVER_MAX_CONNECTIONS and _IDLE_TIMEOUT reach the receiver of a real
    `serve`: with 2 connections allowed, a third silent one gets 503 at once while two are held,
    and the held ones are closed by the server once idle for 1 s (the default is 15 s)."""
    running = start_serve(tmp_path, model, backend, RELEVANCY_TRACER_RECEIVER_MAX_CONNECTIONS="2", RELEVANCY_TRACER_RECEIVER_IDLE_TIMEOUT="1")
    held: list[socket.socket] = []
    try:
        for _ in range(2):
            held.append(socket.create_connection(("127.0.0.1", running.http_port), timeout=10))
        extra = socket.create_connection(("127.0.0.1", running.http_port), timeout=10)
        refused = read_until_closed(extra)
        extra.close()
        started = time.monotonic()
        endings = [read_until_closed(sock) for sock in held]
        waited = time.monotonic() - started
        assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After" in refused
        assert endings == [b"", b""] and waited < 10  # closed by the server, well before the 15 s default
    finally:
        for sock in held:
            sock.close()
        output = stop_serve(running)
    assert "Traceback" not in output, output[-5000:]


# ------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for localhost / 127.0.0.1 (cryptography): (cert, key) paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("tls")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_on_http_and_grpc(model, backend, certificate, tmp_path):
    import grpc

    cert, key = certificate
    serve = start_serve(tmp_path, model, backend, "--tls-cert", cert, "--tls-key", key)
    try:
        body = export_request(chain_span("Where is Tours?", "Tours is on the Loire.")).SerializeToString()
        context = ssl.create_default_context(cafile=cert)
        connection = http.client.HTTPSConnection("127.0.0.1", serve.http_port, context=context, timeout=30)
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf", **AUTH})
        reply = connection.getresponse()
        assert reply.status == 200 and reply.read() == b""
        connection.close()
        plain = serve.raw(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert not plain.startswith(b"HTTP/1.1 200")  # no clear-text service on the TLS port
        credentials = grpc.ssl_channel_credentials(root_certificates=Path(cert).read_bytes())
        assert grpc_call(serve, body, credentials=credentials)[0] == grpc.StatusCode.OK
        assert grpc_call(serve, body, metadata=(), credentials=credentials)[0] == grpc.StatusCode.UNAUTHENTICATED
        assert grpc_call(serve, body)[0] == grpc.StatusCode.UNAVAILABLE  # clear text to a TLS port fails
    finally:
        output = stop_serve(serve)
    assert "TLS, bearer token required" in output


def test_an_encrypted_tls_key_is_named_as_such(certificate, tmp_path):
    """Issue 35, item 16: a passphrase-protected key is refused at start (exit 2) with a message
    saying so, not OpenSSL's "[Errno 22] Invalid argument"."""
    from relevancy_tracer.service.receiver import OTLPServer

    from cryptography.hazmat.primitives import serialization

    cert, key = certificate
    encrypted = tmp_path / "encrypted.key"
    private = serialization.load_pem_private_key(Path(key).read_bytes(), None)
    encrypted.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"passphrase")))
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "serve", "--grpc-port", "0", "--http-port", "0", "--tls-cert", cert, "--tls-key", str(encrypted)]
    proc = subprocess.run(command, env=subprocess_env(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none"), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "encrypted" in proc.stderr and str(encrypted) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    with pytest.raises(OSError, match="encrypted"):  # gRPC alone checks the key too
        OTLPServer(lambda request: None, http_port=None, grpc_port=0, tls_cert=cert, tls_key=str(encrypted)).start()


# ------------------------------------------------------------------------------ connections


@pytest.fixture
def no_exports(monkeypatch):
    """In-process services in these tests export their own telemetry nowhere."""
    for signal_name in ("TRACES", "LOGS", "METRICS"):
        monkeypatch.setenv(f"OTEL_{signal_name}_EXPORTER", "none")


def test_half_open_and_slow_connections_are_bounded_and_timed_out(server, no_exports):
    """300 connections that never send a request: no more than max_connections are held at
    once (the others get 503 at once), each held one is closed by the server after
    idle_timeout; a trickled head is cut off; a slow body gets 408; threads do not grow with
    connections; a normal request is served afterwards."""
    import psutil

    from relevancy_tracer.service import ScoringService
    from relevancy_tracer.service.receiver import ReceiverLimits

    limits = ReceiverLimits(max_connections=50, idle_timeout=1.0, body_timeout=1.0)
    service = ScoringService(openai_settings(server), http_port=0, grpc_port=None, limits=limits).start()
    port = service.server.http_port
    me = psutil.Process()

    def held() -> int:
        """Connections the server holds: its HTTP handlers (a socket's TCP state is no measure:
        one accepted for a 503 is ESTABLISHED until the loop gets to answer it, which on a
        loaded machine can be several at once)."""
        return len(service.server._web.connections)

    def established() -> int:
        return sum(1 for c in me.net_connections("tcp") if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)

    threads_before = threading.active_count()
    sockets: list[socket.socket] = []
    try:
        most = 0
        for _ in range(300):
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            if len(sockets) % 25 == 0:
                most = max(most, held())
        threads_during = threading.active_count()
        endings = []
        for sock in sockets:
            try:
                endings.append(read_until_closed(sock))
            except socket.timeout:
                endings.append("still open")
            most = max(most, held())
        assert 0 < most <= 50 and threads_during - threads_before <= 2
        assert "still open" not in endings and established() == 0  # the server closed every one
        busy = [e for e in endings if e.startswith(b"HTTP/1.1 503")]
        assert busy and all(b"Retry-After: 1" in e for e in busy)
        assert all(e == b"" for e in endings if e not in busy)  # the held ones: closed when idle
        trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
        trickle.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
        assert read_until_closed(trickle) == b""  # a head that never completes: cut off
        trickle.close()
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        assert read_until_closed(slow).startswith(b"HTTP/1.1 408")
        slow.close()
        body = export_request(chain_span("Where is Pau?", "Pau is in the south-west.")).SerializeToString()
        assert urllib_post(port, body) == 200
    finally:
        for sock in sockets:
            sock.close()
        service.stop(10)


def test_a_request_over_the_connection_limit_gets_a_retryable_503_not_a_reset(server, no_exports):
    """With every connection slot held, an exporter that sends its whole 2 MiB body before
    reading (as http.client, urllib3 and the OTLP exporters do) reads the 503 with Retry-After:
    the receiver drains what it sends instead of closing on unread bytes (a TCP reset). Each
    refusal is counted with its reason; once a slot frees the same request is taken."""
    from relevancy_tracer.service import ScoringService
    from relevancy_tracer.service.receiver import ReceiverLimits

    limits = ReceiverLimits(max_connections=4, idle_timeout=5.0, body_timeout=5.0)
    service = ScoringService(openai_settings(server), http_port=0, grpc_port=None, limits=limits).start()
    port = service.server.http_port
    reasons: list[str] = []
    counted = service.server.count_refusal
    service.server.count_refusal = lambda protocol, reason: (reasons.append(reason), counted(protocol, reason))
    body = export_request(chain_span("Where is Pau?", "Pau is in the south-west. " + "x" * (2 << 20))).SerializeToString()
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
    try:
        for _ in range(5):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
                reply = connection.getresponse()
                assert reply.status == 503 and reply.getheader("Retry-After") == "1"
                assert b"too many connections" in reply.read()
            finally:
                connection.close()
        assert reasons == ["too_many_connections"] * 5 and service.refused == 5
    finally:
        for sock in held:
            sock.close()
    status = 503
    for _ in range(50):  # the held connections' handlers are released as their sockets close
        status = urllib_post(port, body)
        if status != 503:
            break
    try:
        assert status == 200
    finally:
        service.stop(10)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; socket.timeout if it never does."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def urllib_post(port: int, body: bytes, content_type: str = "application/x-protobuf") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v1/traces", body=body, headers={"Content-Type": content_type})
        reply = connection.getresponse()
        reply.read()
        return reply.status
    finally:
        connection.close()


# ------------------------------------------------------------------------------ oversized requests


def test_a_request_larger_than_the_queue_is_admitted_when_the_queue_is_empty(server, no_exports):
    """1,001 spans against queue_size 1,000 used to get 429 forever. Now: taken whole on an
    empty queue; refused (retryable) while other work is queued; taken again once drained."""
    from relevancy_tracer.service import ScoringService

    server.chat_delay = 0.1  # the queue is still busy when the second request comes
    service = ScoringService(openai_settings(server, queue_size=5, concurrency=1, hold_timeout=120.0), http_port=0, grpc_port=None).start()
    try:
        # fresh span ids each time: a request re-sent as is would be recognised (decision window)
        big = lambda: export_request(*[chain_span(f"Where is town {i}?", f"Town {i} is in France.") for i in range(12)]).SerializeToString()  # noqa: E731
        assert urllib_post(service.server.http_port, big()) == 200
        assert service.accepted == 12
        assert urllib_post(service.server.http_port, big()) == 429  # the first is still queued
        assert service.flush(60)
        assert urllib_post(service.server.http_port, big()) == 200 and service.accepted == 24
        assert service.flush(60)
        assert len(server.requests_to("chat")) == 24
    finally:
        server.chat_delay = 0.0
        service.stop(10)


def test_the_redis_stream_admits_an_oversized_request_when_empty(tmp_path):
    from relevancy_tracer.service.jobs import ScoreRequest
    from relevancy_tracer.service.queue import RedisStreamQueue
    from relevancy_tracer_testing import RedisServer

    jobs = [ScoreRequest(f"{i:032x}", "1" * 32, "2" * 16, "answer", "app", "q?", "a.", "ragas") for i in range(7)]
    with RedisServer(str(tmp_path)) as redis_server:
        queue = RedisStreamQueue(redis_server.url, max_length=5)
        try:
            assert queue.offer(jobs) and queue.depth() == 7
            assert not queue.offer(jobs[:1])  # at the bound: refused, retryable
        finally:
            queue.close()


# ------------------------------------------------------------------------------ selection


def test_outermost_selection_is_linear_and_walks_whole_ancestries(monkeypatch):
    """8,000 root spans of one trace with a retriever: each trace's documents are collected once
    (they were collected once per candidate: quadratic). A candidate 1,500 levels below another
    is nested (the walk used to stop at 1,000 levels)."""
    from relevancy_tracer.service import selection as selection_module
    from relevancy_tracer.service.otlp import ReceivedSpan
    from relevancy_tracer.service.selection import SpanSelector

    calls = []
    real = selection_module.span_documents
    monkeypatch.setattr(selection_module, "span_documents", lambda attributes: calls.append(1) or real(attributes))
    trace = "ab" * 16
    roots = [ReceivedSpan(trace, f"{i + 1:016x}", "", "answer", 1, {"openinference.span.kind": "CHAIN", "input.value": f"q{i}?", "output.value": f"a{i}."}) for i in range(8000)]
    retriever = ReceivedSpan(trace, "f" * 16, "", "retrieve", 1, {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.content": "a document"})
    chosen = SpanSelector().select(roots + [retriever])
    assert len(chosen) == 8000 and all(c.contexts == ["a document"] for c in chosen)
    assert len(calls) <= 2 * 8001
    chain = [ReceivedSpan(trace, f"{i + 1:016x}", f"{i:016x}" if i else "", "step", 1, {}) for i in range(1502)]
    chain[0].attributes.update({"openinference.span.kind": "CHAIN", "input.value": "top?", "output.value": "top."})
    chain[-1].attributes.update({"openinference.span.kind": "CHAIN", "input.value": "deep?", "output.value": "deep."})
    chosen = SpanSelector().select(chain)
    assert [c.question for c in chosen] == ["top?"]


# ------------------------------------------------------------------------------ fuzzing


JSON_KEYS = st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "parentSpanId", "name", "kind", "attributes", "key", "value", "stringValue", "arrayValue", "kvlistValue", "values", "resource", "scope", "startTimeUnixNano", "links", "intValue", "x"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=40) | st.sampled_from(["CHAIN", "input.value", "output.value", "0" * 32, "ab" * 8, "[[[", '{"question": 1}']),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(JSON_KEYS, children, max_size=5),
    max_leaves=30,
)


def any_value_strategy() -> Any:
    from opentelemetry.proto.common.v1 import common_pb2

    leaf = st.one_of(
        st.text(max_size=60).map(lambda s: common_pb2.AnyValue(string_value=s)),
        st.sampled_from(["[" * 2000, '{"question": "Where?", "messages": [{"role": "user", "content": "Hi"}]}', '[{"role": "user", "parts": [{"type": "text", "content": "Q?"}]}]']).map(lambda s: common_pb2.AnyValue(string_value=s)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: common_pb2.AnyValue(int_value=i)),
        st.booleans().map(lambda b: common_pb2.AnyValue(bool_value=b)),
    )
    return st.recursive(leaf, lambda children: st.lists(children, max_size=3).map(lambda vs: common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=vs))), max_leaves=8)


@st.composite
def protobuf_requests(draw: Any) -> bytes:
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    keys = st.sampled_from(["openinference.span.kind", "input.value", "output.value", "input.mime_type", "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.prompt", "gen_ai.completion", "gen_ai.prompt.0.role", "gen_ai.prompt.0.content", "retrieval.documents.0.document.content", "relevancy.status", "other"])
    trace_ids = st.sampled_from([b"", b"\0" * 16, b"\1" * 8]) | st.binary(min_size=16, max_size=16)
    span_ids = st.sampled_from([b"", b"\0" * 8]) | st.binary(min_size=8, max_size=8)
    spans = []
    for _ in range(draw(st.integers(0, 6))):
        attributes = [common_pb2.KeyValue(key=k, value=v) for k, v in draw(st.lists(st.tuples(keys, any_value_strategy()), max_size=6))]
        kind = draw(st.sampled_from([None, "CHAIN", "LLM", "AGENT", "RETRIEVER", "EVALUATOR"]))
        if kind:
            attributes.append(kv("openinference.span.kind", kind))
        span_id = draw(span_ids)
        parent = draw(st.sampled_from([b"", span_id, b"\2" * 8]))
        spans.append(trace_pb2.Span(trace_id=draw(trace_ids), span_id=span_id, parent_span_id=parent, name=draw(st.text(max_size=10)), attributes=attributes))
    body = export_request(*spans).SerializeToString()
    cut = draw(st.sampled_from([None, None, None, 1, 7, len(body) // 2]))
    return body[:cut] + draw(st.binary(max_size=8)) if cut is not None else body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=JSON_VALUES, gzip_it=st.booleans())
def test_fuzzed_otlp_json_is_always_answered(serve, body, gzip_it):
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if gzip_it:
        data, headers["Content-Encoding"] = gzip.compress(data), "gzip"
    status, _, reply = serve.post(data, headers)
    assert status in (200, 400, 429) and reply, (status, reply[:300])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=protobuf_requests())
def test_fuzzed_otlp_protobuf_is_always_answered(serve, body):
    import grpc

    status, _, reply = serve.post(body)
    assert status in (200, 400, 429), (status, reply[:300])
    assert status == 200 or reply
    code = grpc_call(serve, body)[0]
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE)


def test_after_the_attacks_serve_is_alive_with_bounded_memory(serve):
    """Runs last in this module: the process survived everything above, answers, and its
    resident memory stays well under what the gzip bomb alone used to take (400 MB)."""
    assert serve.alive()
    assert serve.post(export_request(chain_span("Where is Albi?", "Albi is in Occitania.")).SerializeToString())[0] == 200
    assert serve.rss() < 300 * (1 << 20)  # 123 MiB here


# ------------------------------------------------------------------------------ queue deadlines


def test_serve_never_times_out_an_accepted_span_for_waiting_in_the_queue(server, no_exports):
    """Issue 35 item 7: 400 spans answered 200 ended 168 as ``timeout`` unscored, because queued
    jobs took ``hold_timeout`` (an ``answer_span`` setting of the decorator) as their deadline.
    An accepted span waits as long as the queue needs; only a running evaluation has a limit."""
    import threading

    from relevancy_tracer.service import ScoringService
    from relevancy_tracer_testing import Gate

    gate = threading.Event()
    server.chat.push(Gate(gate))  # the first evaluation holds the only slot until the gate opens
    service = ScoringService(openai_settings(server, concurrency=1, hold_timeout=0.001), http_port=0, grpc_port=None).start()
    try:
        body = export_request(*[chain_span(f"Where is town {i}?", f"Town {i} is in France.") for i in range(4)]).SerializeToString()
        assert urllib_post(service.server.http_port, body) == 200
        assert server.wait_for_requests("chat", 1, timeout=10)  # the others queued far past 1 ms
        gate.set()
        assert service.flush(60)
        counts = service.telemetry.metrics.counts()
        statuses = {key[1]: n for key, n in counts.items()}
        assert statuses == {"scored": 4}, counts
    finally:
        gate.set()
        service.stop(10)


# ------------------------------------------------------------------------------ issue 42: tokens


def test_a_non_utf8_byte_in_authorization_gets_401_and_a_counted_refusal(server, no_exports):
    """Issue 42, item 8: `Authorization: Bearer \\xff...` (a byte no UTF-8 decoder takes) is a
    wrong token: 401 with `WWW-Authenticate: Bearer`, counted in `relevancy.service.refused` as
    `unauthenticated` (before: 500 "Server got itself in trouble", nothing counted). A wrong
    gRPC token is counted the same way."""
    import grpc

    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, service_token=TOKEN), http_port=0, grpc_port=0).start()
    reasons: list[tuple[str, str]] = []
    counted = service.server.count_refusal
    service.server.count_refusal = lambda protocol, reason: (reasons.append((protocol, reason)), counted(protocol, reason))
    try:
        body = export_request(chain_span("q?", "a.")).SerializeToString()
        for value in (b"Bearer \xff\xfe" + TOKEN.encode(), b"Bearer " + TOKEN.encode() + b"\xc3", b"\x80"):
            head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nAuthorization: " + value
            head += b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            with socket.create_connection(("127.0.0.1", service.server.http_port), timeout=10) as sock:
                sock.sendall(head + body)
                reply = read_response(sock)
            assert reply.startswith(b"HTTP/1.1 401"), reply[:300]
            assert b"WWW-Authenticate: Bearer" in reply
        running = Serve(None, service.server.http_port, service.server.grpc_port, Path("."))  # type: ignore[arg-type]
        assert grpc_call(running, body, metadata=(("authorization", "Bearer wrong"),))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert reasons == [("http", "unauthenticated")] * 3 + [("grpc", "unauthenticated")]
        assert service.refused == 4
    finally:
        service.stop(5)


def test_a_token_with_surrounding_whitespace_is_stripped(model, backend, tmp_path):
    """Issue 42, item 6: `RELEVANCY_TRACER_SERVICE_TOKEN=$'tok\\n'` (a Kubernetes secret made
    with --from-file) is the token `tok`: a real `serve` takes `Bearer tok` over HTTP and gRPC
    (before: every request 401 / UNAUTHENTICATED, as no client can send the newline). API keys
    are stripped alike."""
    import grpc

    from relevancy_tracer.config import Settings

    resolved = Settings.resolve(environ={"RELEVANCY_TRACER_SERVICE_TOKEN": f" {TOKEN}\r\n", "OPENAI_API_KEY": "sk-1\n"})
    assert resolved.service_token == TOKEN and resolved.llm_api_key == "sk-1"
    assert Settings.resolve(service_token=f"{TOKEN}\n").service_token == TOKEN
    running = start_serve(tmp_path, model, backend, RELEVANCY_TRACER_SERVICE_TOKEN=f"{TOKEN}\n")
    try:
        body = export_request(chain_span("Where is Caen?", "Caen is in Normandy.")).SerializeToString()
        assert running.post(body)[0] == 200
        assert grpc_call(running, body)[0] == grpc.StatusCode.OK
    finally:
        output = stop_serve(running)
    assert "Traceback" not in output, output[-5000:]


@pytest.mark.parametrize("token", ["tok\nen", "t\u00f6ken", "tok\x7fen", "tok\ten"])
def test_a_token_no_client_can_send_stops_serve_at_start(no_exports, token):
    """Issue 42, item 6: a token holding a character no client can send in a header (a newline
    or tab inside, DEL, a non-ASCII letter) can never match: `serve` exits 2 at start with a
    message naming the setting (before: it started and refused every request)."""
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "serve", "--http-port", "0", "--grpc-port", "0", "--llm", "openai", "--embeddings", "openai"]
    proc = subprocess.run(command, env=subprocess_env(RELEVANCY_TRACER_SERVICE_TOKEN=token), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "RELEVANCY_TRACER_SERVICE_TOKEN" in proc.stderr and "printable ASCII" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _serve_with_descriptor_limit(tmp: Path, model: FakeOpenAIServer, backend: OTLPReceiver, limit: int, **env: str) -> Serve:
    """`serve` (with the token) in a process whose RLIMIT_NOFILE is ``limit``."""
    import resource

    http_port, grpc_port = free_port(), free_port()
    log = tmp / f"serve-{http_port}.log"
    environment = subprocess_env(fake_model_env(model), dict(
        RELEVANCY_TRACER_METHOD="ragas", RELEVANCY_TRACER_SERVICE_TOKEN=TOKEN, OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRICS_EXPORTER="none", OTEL_BSP_SCHEDULE_DELAY="200",
    ), env)

    def child_setup() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "serve", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=child_setup)
    running = Serve(proc, http_port, grpc_port, log)
    wait_until(lambda: proc.poll() is not None or "OTLP/HTTP" in log.read_text(), 60, "serve to listen")
    assert proc.poll() is None, log.read_text()[-3000:]
    return running


def test_idle_connections_to_the_grpc_port_cannot_take_every_file_descriptor(model, backend, tmp_path):
    """Issue 42, item 4: `serve` with a token, a 1,024 descriptor limit and a 2 s idle timeout;
    1,100 TCP connections to its gRPC port that send nothing. grpc core holds at most
    `receiver_max_connections` (256) of them and closes the others at once, before any
    handshake (`grpc.max_allowed_incoming_connections`), and closes the held ones once they
    complete no handshake within the idle timeout (`grpc.server_handshake_timeout_ms`). While
    they are held an HTTP export is served at once, and an authenticated gRPC export (its
    channel retrying the refused connection, as exporters do) once the idle ones are closed;
    the log holds no `Too many open files` traceback (before: 1,024 descriptors taken, the
    gRPC export DEADLINE_EXCEEDED, hundreds of KB of accept() tracebacks)."""
    import resource

    import grpc
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this test needs 2,048 descriptors of its own; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    running = _serve_with_descriptor_limit(tmp_path, model, backend, 1024, RELEVANCY_TRACER_RECEIVER_IDLE_TIMEOUT="2")
    held: list[socket.socket] = []
    try:
        for _ in range(1100):
            sock = socket.socket()
            sock.settimeout(10)
            try:
                sock.connect(("127.0.0.1", running.grpc_port))
            except OSError:  # the backlog full for a moment: the flood goes on
                sock.close()
                continue
            held.append(sock)
        assert len(held) >= 1000
        descriptors = psutil.Process(running.proc.pid).num_fds()
        body = export_request(chain_span("Where is Laval?", "Laval is in Mayenne.")).SerializeToString()
        assert running.post(body, timeout=10)[0] == 200
        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        try:
            started = time.monotonic()
            call = channel.unary_unary("/" + TRACES, request_serializer=None, response_deserializer=None)
            call(body, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=20, wait_for_ready=True)
            print(f"gRPC export served {time.monotonic() - started:.1f} s into the flood; serve held {descriptors} descriptors")
        finally:
            channel.close()
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        output = stop_serve(running)
    assert descriptors < 700, descriptors  # 256 gRPC connections at most, plus the process's own
    assert "Too many open files" not in output and "Traceback" not in output, output[-5000:]


def test_accepts_failing_for_want_of_descriptors_are_counted_and_logged_once_per_interval(server, no_exports, caplog):
    """Issue 42, item 4: when the process is at its descriptor limit asyncio logs every failed
    accept() of the HTTP listener with a traceback (1,328-2,052 of them in 15-25 s before). The
    receivers' loop counts each as a refusal (`out_of_file_descriptors`) and logs one line
    with the count per ACCEPT_ERROR_LOG_INTERVAL; other loop errors go to asyncio's handler."""
    import errno
    import logging

    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server), http_port=0, grpc_port=None).start()
    reasons: list[str] = []
    counted = service.server.count_refusal
    service.server.count_refusal = lambda protocol, reason: (reasons.append(reason), counted(protocol, reason))
    loop = service.server._loop
    try:
        with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
            for _ in range(500):
                context = {"message": "socket.accept() out of system resource", "exception": OSError(errno.EMFILE, "Too many open files")}
                loop.call_soon_threadsafe(loop.call_exception_handler, context)
            done = threading.Event()
            loop.call_soon_threadsafe(done.set)
            assert done.wait(10)
        lines = [r for r in caplog.records if "not accepted" in r.getMessage()]
        assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
        assert reasons == ["out_of_file_descriptors"] * 500 and service.refused == 500
    finally:
        service.stop(5)


def test_serve_refuses_a_huge_model_reply_as_a_model_error(serve, model, backend):
    """Issue 42, round of our own: the reply cap holds on `serve`'s path. A 50 MB chunked
    reply from the judge (the default `llm_max_reply_bytes`, 8 MiB) ends that span's
    evaluation as an error (`model_error` naming the setting) on its EVALUATOR span; `serve`
    stays up and scores the next span."""
    from relevancy_tracer_testing import Huge

    model.chat.push(Huge(50_000_000, chunked=True))
    spans = [chain_span("Where is Brest?", "Brest is in Brittany."), chain_span("Where is Metz?", "Metz is in Lorraine.")]
    for span in spans:
        assert serve.post(export_request(span).SerializeToString())[0] == 200
    keys = [(span.trace_id.hex(), span.span_id.hex()) for span in spans]
    found = evaluations_of(backend.wait_for_spans(lambda s: all(k in evaluations_of(s) for k in keys), timeout=60))
    failed, scored = sorted((found[k]["attributes"] for k in keys), key=lambda a: a[A.STATUS] != "error")  # either may meet the huge reply
    assert failed[A.STATUS] == "error" and failed[A.ERROR_TYPE] == "model_error", failed
    assert "llm_max_reply_bytes" in str(failed.get(A.ERROR)), failed
    assert scored[A.STATUS] == "scored" and serve.alive()


def test_a_deeply_nested_protobuf_value_and_zero_length_ids_are_answered(serve):
    """Issue 42, round of our own: a span attribute whose AnyValue nests arrays 50, 1,000 and
    100,000 deep (built as bytes: no protobuf encoder would), on HTTP and gRPC: 400 /
    INVALID_ARGUMENT at once from upb's depth limit, nothing decoded; spans with zero-length
    trace or span ids: 200 with `partial_success.rejected_spans`, the valid span of the same
    request taken."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    from opentelemetry.proto.common.v1 import common_pb2

    for depth in (50, 1_000, 100_000):
        value = common_pb2.AnyValue(string_value="x").SerializeToString()
        for _ in range(depth):  # AnyValue.array_value (5) -> ArrayValue.values (1) -> AnyValue
            value = _length_delimited(5, _length_delimited(1, value))
        attribute = common_pb2.KeyValue(key="deep").SerializeToString() + _length_delimited(2, value)
        span = chain_span("Where is Caen?", "Caen is in Normandy.").SerializeToString() + _length_delimited(9, attribute)
        body = _length_delimited(1, _length_delimited(2, _length_delimited(2, span)))
        assert_status(serve.post(body), 400, "protobuf")
        assert grpc_call(serve, body)[0] == grpc.StatusCode.INVALID_ARGUMENT
    spans = [chain_span("Where is Vannes?", "In Brittany."), chain_span("q?", "a.", trace_id=b""), chain_span("q?", "a.", span_id=b"")]
    for call in (lambda body: serve.post(body), lambda body: grpc_call(serve, body)):
        reply = call(export_request(*spans).SerializeToString())
        response = ExportTraceServiceResponse.FromString(reply[2])
        assert reply[0] in (200, grpc.StatusCode.OK) and response.partial_success.rejected_spans == 2, reply[:2]
    assert serve.alive()


def test_serve_raises_its_soft_descriptor_limit_and_warns_below_what_it_needs(model, backend, tmp_path):
    """Issue 42, round of our own: `serve` may hold 3 x receiver_max_connections descriptors
    (HTTP connections, lingering 503s, gRPC connections) plus its own. With a soft limit of
    512 and a hard one of 4,096 it raises the soft limit to what it needs (1,024 at the default
    256 connections); with both at 512 it warns at start, naming the setting."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"needs a hard descriptor limit of 4,096; it is {hard}")
    outputs = {}
    for limits in ((512, 4096), (512, 512)):
        http_port = free_port()
        log = tmp_path / f"serve-{http_port}.log"

        def child_setup(limits=limits) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)

        command = [str(Path(sys.executable).parent / "relevancy-tracer"), "serve", "--http-port", str(http_port), "--grpc-port", "0"]
        env = subprocess_env(fake_model_env(model), RELEVANCY_TRACER_SERVICE_TOKEN=TOKEN, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
        proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=child_setup)
        running = Serve(proc, http_port, 0, log)
        try:
            wait_until(lambda: proc.poll() is not None or "OTLP/HTTP" in log.read_text(), 60, "serve to listen")
            limit_line = next(l for l in Path(f"/proc/{proc.pid}/limits").read_text().splitlines() if l.startswith("Max open files"))
        finally:
            outputs[limits] = (stop_serve(running), limit_line.split()[3])
    raised, warned = outputs[(512, 4096)], outputs[(512, 512)]
    assert raised[1] == "1024" and "file descriptor limit" not in raised[0], raised
    assert warned[1] == "512" and "RELEVANCY_TRACER_RECEIVER_MAX_CONNECTIONS" in warned[0], warned[0][-2000:]
