"""The peer on the same hardware: ragas 0.4.3's answer relevancy against relevancy-tracer's default,
both on the embedded Qwen2.5-Coder-1.5B GGUF with the same CPU threads, same rows, same run.

* **ragas**: ``ragas.metrics.collections.AnswerRelevancy`` (ragas 0.4's recommended API,
  strictness 3: three question-generation requests per answer, instructor JSON mode) with
  ``llm_factory(client=AsyncOpenAI(base_url=<llama-cpp-python's OpenAI-compatible server>))``
  and ``embedding_factory("openai", client=AsyncOpenAI(base_url=<embeddings server>))``. The
  llama.cpp server runs the same GGUF file with ``--n_threads`` and ``--n_threads_batch`` equal
  to ``--threads``; the embeddings server serves the same local embedder relevancy-tracer uses,
  so only the method differs. A counting proxy in front of the llama.cpp server records every
  chat request and its token usage. ragas runs in ``.venv-bench`` (its pins clash with the dev
  tools), as a subprocess of this script.
* **relevancy-tracer**: ``Engine.ascore`` with the default method and the embedded models,
  in-process, ``local_threads=--threads``.

Both score the same rows, after a warm-up evaluation that loads the models: one at a time by
default, or ``--concurrency N`` evaluations in flight on each side (ragas's three requests per
evaluation and N evaluations queue at the llama.cpp server, which runs one request at a time;
relevancy-tracer's decoder batches concurrent requests). Seconds per evaluation are the sum of
the evaluations' latencies one at a time, and wall-clock time over evaluations when concurrent. Reported: seconds per evaluation, chat requests and tokens per
evaluation, pairwise accuracy per perturbation (ties 0.5) on the contrastive pair sets. Only one
model-heavy process runs at a time.

Usage (from the repository root, after ``make bench``'s venvs exist)::

    .venv/bin/python -m benchmarks.local                 # 10 English + 10 Chinese reference rows
    .venv/bin/python -m benchmarks.local --rows 6 --threads 2
    .venv/bin/python -m benchmarks.local --concurrency 4 --out benchmarks/results/local_c4.json
    .venv/bin/python -m benchmarks.local --ragas-from benchmarks/results/local_work   # ours only, same rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from benchmarks import quality  # noqa: E402

BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"


# ---------------------------------------------------------------------------------- servers


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self.server.owner.get(self)  # type: ignore[attr-defined]

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        length = int(self.headers.get("Content-Length") or 0)
        self.server.owner.post(self, self.rfile.read(length))  # type: ignore[attr-defined]


class _Server:
    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def get(self, handler: _Handler) -> None:
        handler._reply(200, json.dumps({"object": "list", "data": [{"id": "local", "object": "model"}]}).encode())

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class EmbeddingsServer(_Server):
    """``POST /v1/embeddings`` served by one of this package's local embedders."""

    def __init__(self, model: str) -> None:
        from relevancy_tracer.models.local_embed import make_local_embedder

        self.embedder = make_local_embedder(model)
        self.lock = threading.Lock()
        super().__init__()

    def post(self, handler: _Handler, body: bytes) -> None:
        request = json.loads(body)
        texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
        with self.lock:
            vectors = self.embedder.embed_sync(texts)
        data = [{"object": "embedding", "index": i, "embedding": [float(x) for x in v]} for i, v in enumerate(vectors)]
        handler._reply(200, json.dumps({"object": "list", "data": data, "model": request.get("model", "local"), "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode())


class CountingProxy(_Server):
    """Forwards chat requests to ``upstream`` and records each request's token usage."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.records: list[dict] = []
        self.lock = threading.Lock()
        super().__init__()

    def post(self, handler: _Handler, body: bytes) -> None:
        request = urllib.request.Request(self.upstream + handler.path[len("/v1") :], data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=900) as response:  # noqa: S310 - local URL
                payload = response.read()
                code = response.status
        except urllib.error.HTTPError as exc:
            payload, code = exc.read(), exc.code
        try:
            usage = json.loads(payload).get("usage") or {}
        except ValueError:
            usage = {}
        with self.lock:
            self.records.append({"path": handler.path, "code": code, "prompt_tokens": int(usage.get("prompt_tokens") or 0), "completion_tokens": int(usage.get("completion_tokens") or 0)})
        handler._reply(code, payload)

    def mark(self) -> int:
        with self.lock:
            return len(self.records)

    def since(self, mark: int) -> list[dict]:
        with self.lock:
            return list(self.records[mark:])


def start_llama_server(gguf: Path, threads: int, n_ctx: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's OpenAI-compatible server on a free port, its output in ``log_path``;
    waits until it answers."""
    from relevancy_tracer._phoenix_server import free_port

    port = free_port()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx), "--model_alias", "qwen2.5-coder-1.5b"]
    # llama.cpp logs a lot while loading: to a file, never to an undrained pipe (which blocks it)
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process by the caller
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited: {log_path.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):  # noqa: S310 - local URL
                return process, url
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("llama_cpp.server did not start in 300 s")


# ---------------------------------------------------------------------------------- ragas side


def ragas_worker(args: argparse.Namespace) -> int:
    """Runs inside .venv-bench: scores the items file with ragas, writes results JSON."""
    import asyncio
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    from openai import AsyncOpenAI
    from ragas.embeddings.base import embedding_factory
    from ragas.llms import llm_factory
    from ragas.metrics.collections import AnswerRelevancy

    items = json.loads(Path(args.items).read_text(encoding="utf-8"))
    llm_client = AsyncOpenAI(base_url=args.llm_url, api_key="EMPTY", timeout=900, max_retries=0)
    embed_client = AsyncOpenAI(base_url=args.embed_url, api_key="EMPTY", timeout=120, max_retries=0)
    metric = AnswerRelevancy(llm=llm_factory("qwen2.5-coder-1.5b", client=llm_client, max_tokens=256), embeddings=embedding_factory("openai", model="local", client=embed_client), strictness=3)

    async def evaluate(item: dict) -> dict:
        try:
            return {"score": float((await metric.ascore(user_input=item["question"], response=item["answer"])).value), "error": None}
        except Exception as exc:  # ragas raises on malformed model output; counted as a failure
            return {"score": None, "error": f"{type(exc).__name__}: {exc}"[:300]}

    results, wall = asyncio.run(run_limited(items, evaluate, args.concurrency, "ragas"))
    Path(args.results).write_text(json.dumps({"results": results, "wall_seconds": wall}), encoding="utf-8")
    return 0


# ---------------------------------------------------------------------------------- orchestration


async def run_limited(items: list[dict], evaluate: Any, concurrency: int, label: str) -> tuple[list[dict], float]:
    """``await evaluate(item)`` (a dict with ``score``) for every item, at most ``concurrency`` in
    flight; each result gets its item's ``index`` and its latency in ``seconds``. Returns the
    results in item order and the wall-clock seconds of the whole run. Both sides use it."""
    import asyncio

    limit = asyncio.Semaphore(concurrency)
    results: list[dict] = []

    async def one(index: int, item: dict) -> None:
        async with limit:
            started = time.perf_counter()
            result = {"index": index} | await evaluate(item)
            result["seconds"] = time.perf_counter() - started
            results.append(result)
            score = result["score"]
            print(f"  {label} [{len(results)}/{len(items)}] {score if score is None else round(score, 3)} {result['seconds']:.1f}s", flush=True)

    started = time.perf_counter()
    await asyncio.gather(*(one(index, item) for index, item in enumerate(items)))
    return sorted(results, key=lambda r: r["index"]), time.perf_counter() - started


def run_ragas(items: list[dict], gguf: Path, threads: int, embedding_model: str, work: Path, concurrency: int = 1) -> tuple[list[dict], list[dict], float]:
    embeddings = EmbeddingsServer(embedding_model)
    server, url = start_llama_server(gguf, threads, 4096, work / "llama_server.log")
    proxy = CountingProxy(url)
    try:
        items_path, results_path = work / "ragas_items.json", work / "ragas_results.json"
        items_path.write_text(json.dumps(items), encoding="utf-8")
        # warm-up: the server has loaded the model; one request settles its caches
        warm = json.dumps({"model": "qwen2.5-coder-1.5b", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4}).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "/chat/completions", data=warm, headers={"Content-Type": "application/json"}), timeout=300):  # noqa: S310 - local URL
            pass
        mark = proxy.mark()
        command = [str(BENCH_PYTHON), "-m", "benchmarks.local", "--ragas-worker", "--items", str(items_path), "--results", str(results_path), "--llm-url", proxy.url, "--embed-url", embeddings.url, "--concurrency", str(concurrency)]
        subprocess.run(command, check=True, cwd=ROOT, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
        requests = proxy.since(mark)
        (work / "ragas_requests.json").write_text(json.dumps(requests), encoding="utf-8")  # for --ragas-from
        written = json.loads(results_path.read_text(encoding="utf-8"))
        return written["results"], requests, written["wall_seconds"]
    finally:
        proxy.stop()
        embeddings.stop()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def run_default(items: list[dict], threads: int, concurrency: int = 1) -> tuple[list[dict], float]:
    import asyncio

    from relevancy_tracer.config import Settings
    from relevancy_tracer.scoring.engine import Engine

    # in process, as the module says (the default since then runs the models in the model host)
    engine = Engine(Settings.resolve(llm="local", embeddings="local", local_threads=threads, local_host=False))
    engine.score("Warm-up question?", "Warm-up answer.")

    async def evaluate(item: dict) -> dict:
        result = await engine.ascore(item["question"], item["answer"])
        return {"score": result.score, "error": result.error, "llm_calls": result.llm_calls, "input_tokens": result.input_tokens, "output_tokens": result.output_tokens, "method": result.method}

    results, wall = asyncio.run(run_limited(items, evaluate, concurrency, "relevancy-tracer"))
    close = getattr(engine.models.llm, "close", None)
    if close is not None:
        close()
    return results, wall


def summarise(name: str, items: list[dict], results: list[dict], requests: Optional[list[dict]] = None, wall_seconds: Optional[float] = None) -> dict:
    """Seconds per evaluation: ``wall_seconds`` over evaluations when given (concurrent runs),
    else the sum of the evaluations' latencies (one at a time)."""
    records = []
    for item, result in zip(items, results):
        records.append({k: item[k] for k in ("set", "id", "cand", "label", "subset")} | {"score": result["score"], "raw": result["score"], "status": "scored" if result["score"] is not None else "failed"})
    n = len(results)
    seconds = wall_seconds if wall_seconds is not None else sum(r["seconds"] for r in results)
    if requests is not None:  # ragas: from the counting proxy
        chat = [r for r in requests if r["path"].endswith("/chat/completions")]
        calls, tokens_in, tokens_out = len(chat), sum(r["prompt_tokens"] for r in chat), sum(r["completion_tokens"] for r in chat)
    elif all("llm_calls" in r for r in results):
        calls = sum(r["llm_calls"] for r in results)
        tokens_in = sum(r["input_tokens"] for r in results)
        tokens_out = sum(r["output_tokens"] for r in results)
    else:  # ragas reused from a run that did not keep the proxy's counts
        calls = tokens_in = tokens_out = None
    pairs = quality.pair_report(records, "score")
    return {
        "name": name,
        "evaluations": n,
        "seconds_per_eval": round(seconds / n, 2),
        "latency_per_eval": round(sum(r["seconds"] for r in results) / n, 2),
        "llm_calls_per_eval": None if calls is None else round(calls / n, 2),
        "input_tokens_per_eval": None if tokens_in is None else round(tokens_in / n, 1),
        "output_tokens_per_eval": None if tokens_out is None else round(tokens_out / n, 1),
        "failures": sum(1 for r in results if r["score"] is None),
        "pairs": pairs,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10, help="reference rows per pair set (each with its degraded answers)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=quality.RESULTS / "local.json")
    parser.add_argument("--concurrency", type=int, default=1, help="evaluations in flight on each side (default 1: one at a time)")
    parser.add_argument("--ragas-from", type=Path, default=None, help="reuse the ragas side of an earlier run of the same rows: its work directory (ragas_items.json, ragas_results.json, and ragas_requests.json for the token counts when it was written)")
    parser.add_argument("--ragas-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--items", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    parser.add_argument("--llm-url", help=argparse.SUPPRESS)
    parser.add_argument("--embed-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ragas_worker:
        return ragas_worker(args)
    if not BENCH_PYTHON.exists():
        print(f"needs {BENCH_PYTHON}: python3 -m venv .venv-bench && .venv-bench/bin/pip install -e '.[bench]'", file=sys.stderr)
        return 2

    from relevancy_tracer.config import Settings
    from relevancy_tracer.models.local_llm import LOCAL_MODELS, assemble_model

    settings = Settings.resolve(llm="local", embeddings="local")
    gguf = assemble_model(LOCAL_MODELS[settings.resolved_llm_model])
    items = quality.load_items(["pairs_en", "pairs_zh"], args.rows)
    work = args.out.parent / "local_work"
    work.mkdir(parents=True, exist_ok=True)
    print(f"{len(items)} evaluations per method; {args.threads} threads; {gguf.name} + {settings.resolved_embedding_model}", flush=True)

    print("== ragas 0.4.3 AnswerRelevancy via llama-cpp-python's server", flush=True)
    if args.ragas_from is not None:
        saved = args.ragas_from
        if json.loads((saved / "ragas_items.json").read_text(encoding="utf-8")) != items:
            print(f"{saved} holds other rows than --rows {args.rows}", file=sys.stderr)
            return 2
        written = json.loads((saved / "ragas_results.json").read_text(encoding="utf-8"))
        ragas_results, ragas_wall = written["results"], written["wall_seconds"]
        requests_path = saved / "ragas_requests.json"
        requests = json.loads(requests_path.read_text(encoding="utf-8")) if requests_path.exists() else None
        print(f"   reused from {saved} ({len(ragas_results)} results; token counts {'reused' if requests is not None else 'not recorded'})", flush=True)
    else:
        ragas_results, requests, ragas_wall = run_ragas(items, gguf, args.threads, settings.resolved_embedding_model, work, args.concurrency)
    concurrent = args.concurrency > 1
    ragas = summarise("ragas 0.4.3 AnswerRelevancy (llama.cpp server)", items, ragas_results, requests, ragas_wall if concurrent else None)
    print("== relevancy-tracer default, in-process", flush=True)
    our_results, our_wall = run_default(items, args.threads, args.concurrency)
    ours = summarise(f"relevancy-tracer {settings.method} (in-process)", items, our_results, wall_seconds=our_wall if concurrent else None)

    lines = ["| method | s/eval | chat requests/eval | tokens in / out per eval | " + " | ".join(f"{lang[-2:]} {p.split('_')[0]}" for lang in ("pairs_en", "pairs_zh") for p in quality.PERTURBATIONS) + " | failures |"]
    lines.append("| --- " * (5 + 2 * len(quality.PERTURBATIONS)) + "|")
    for row in (ragas, ours):
        acc = [row["pairs"].get(lang, {}).get(p, {}).get("accuracy") for lang in ("pairs_en", "pairs_zh") for p in quality.PERTURBATIONS]
        calls = "-" if row["llm_calls_per_eval"] is None else f"{row['llm_calls_per_eval']:.1f}"
        tokens = "-" if row["input_tokens_per_eval"] is None else f"{row['input_tokens_per_eval']:.0f} / {row['output_tokens_per_eval']:.0f}"
        lines.append(f"| {row['name']} | {row['seconds_per_eval']:.1f} | {calls} | {tokens} | " + " | ".join("-" if a is None else f"{a:.2f}" for a in acc) + f" | {row['failures']} |")
    ratio = ours["seconds_per_eval"] / ragas["seconds_per_eval"]
    lines.append("")
    lines.append(f"relevancy-tracer / ragas seconds per evaluation: **{ratio:.2f}x** (target <= 0.5x)")
    table = "\n".join(lines)
    print("\n" + table)
    args.out.write_text(json.dumps({"threads": args.threads, "rows": args.rows, "concurrency": args.concurrency, "ragas": ragas, "relevancy_tracer": ours, "ratio_seconds": ratio}, indent=1), encoding="utf-8")
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
