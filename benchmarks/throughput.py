"""Engine throughput: relevancy-tracer's ``ragas`` method against ragas 0.4.3's answer relevancy.

Every variant scores the same rows (default 200 (question, answer) pairs) at the same
concurrency limit (default 16 evaluations in flight) and strictness (3 generated questions),
against one :class:`relevancy_tracer_testing.FakeOpenAIServer` with ``chat_delay=0.1`` s and
``embedding_delay=0.01`` s. The server runs in a child process, so its request handling does
not compete with the library under test for the GIL; every request it receives is recorded and
summarised there.

Variants:

* ``rt-joint``: ``Engine.aevaluate`` with ``method="ragas"``, ``generation="joint"`` (default):
  one chat request returns all N questions, one embeddings request embeds the question and them.
* ``rt-independent``: the same with ``generation="independent"``: N chat requests, as RAGAS.
* ``ragas-collections``: ``ragas.metrics.collections.AnswerRelevancy`` (the API ragas 0.4
  recommends) with ``llm_factory(client=AsyncOpenAI)`` and ``embedding_factory("openai",
  client=AsyncOpenAI)``.
* ``ragas-legacy``: ``ragas.metrics.ResponseRelevancy`` (what ``answer_relevancy`` is an
  instance of) with ``LangchainLLMWrapper(ChatOpenAI)`` and
  ``LangchainEmbeddingsWrapper(OpenAIEmbeddings)``, scored with ``single_turn_ascore``.

Figures per variant: evaluations per second (rows / wall-clock seconds of the batch), chat and
embeddings requests per evaluation, chat prompt tokens per evaluation (the server's
tokenizer-free count of every chat request's message contents, the same function for every
variant; a request with ``n`` > 1 counts its prompt once, as OpenAI bills it), embedding input
tokens per evaluation, the most requests of each kind the server had in flight at once, and
the ratios relevancy-tracer / ragas. The batch runs ``--rounds`` times per variant, variants
rotated each round; the reported rate is the median round.

Usage::

    .venv-bench/bin/python -m benchmarks.throughput            # 200 rows x 5 rounds
    .venv-bench/bin/python -m benchmarks.throughput --quick    # 40 rows x 1 round

Writes benchmarks/results/throughput.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import platform
import re
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")  # ragas's usage analytics: off
os.environ.setdefault("OPENAI_API_KEY", "benchmark-key")  # the fake server accepts any key

HERE = Path(__file__).resolve().parent

from benchmarks._paths import relative  # noqa: E402

from relevancy_tracer_testing import FakeOpenAIServer, count_tokens, default_chat_reply  # noqa: E402

CHAT_MODEL = "gpt-4o-mini"
EMBEDDING_MODEL = "text-embedding-3-small"
RAGAS_MARKER = "Generate a question for the given answer"
RAGAS_INPUT = "Now perform the same with the following input\ninput: "
VARIANTS = ("rt-joint", "rt-independent", "ragas-collections", "ragas-legacy")
BASELINES = ("ragas-collections", "ragas-legacy")

# ------------------------------------------------------------------------------------ rows

_PLACES = [
    ("France", "Paris", "western Europe", "the Seine"), ("Germany", "Berlin", "central Europe", "the Spree"),
    ("Italy", "Rome", "southern Europe", "the Tiber"), ("Spain", "Madrid", "the Iberian Peninsula", "the Manzanares"),
    ("Portugal", "Lisbon", "the Iberian Peninsula", "the Tagus"), ("Austria", "Vienna", "central Europe", "the Danube"),
    ("Hungary", "Budapest", "central Europe", "the Danube"), ("Poland", "Warsaw", "central Europe", "the Vistula"),
    ("Czechia", "Prague", "central Europe", "the Vltava"), ("Egypt", "Cairo", "north Africa", "the Nile"),
    ("Iraq", "Baghdad", "western Asia", "the Tigris"), ("Russia", "Moscow", "eastern Europe", "the Moskva"),
    ("United Kingdom", "London", "northern Europe", "the Thames"), ("Ireland", "Dublin", "northern Europe", "the Liffey"),
    ("Argentina", "Buenos Aires", "South America", "the Rio de la Plata"), ("Thailand", "Bangkok", "south-east Asia", "the Chao Phraya"),
    ("Vietnam", "Hanoi", "south-east Asia", "the Red River"), ("Mali", "Bamako", "west Africa", "the Niger"),
    ("Sudan", "Khartoum", "north-east Africa", "the Nile"), ("Serbia", "Belgrade", "the Balkans", "the Danube"),
    ("Slovakia", "Bratislava", "central Europe", "the Danube"), ("Latvia", "Riga", "the Baltics", "the Daugava"),
    ("Lithuania", "Vilnius", "the Baltics", "the Neris"), ("Romania", "Bucharest", "eastern Europe", "the Dambovita"),
    ("Ukraine", "Kyiv", "eastern Europe", "the Dnipro"),
]
_TEMPLATES = [
    ("What is the capital of {c}?", "The capital of {c} is {k}. {k} lies on {r} and is the largest city of the country, which is in {g}."),
    ("Which river flows through {k}?", "{r} flows through {k}, the capital of {c}. The river shaped the city's trade and its old town."),
    ("Where is {c} located?", "{c} is located in {g}. Its capital is {k}, on {r}, and it borders several neighbouring countries."),
    ("Is {k} the capital of {c}?", "Yes, {k} is the capital of {c}. It is the seat of government and sits on {r} in {g}."),
    ("Tell me about {k}.", "{k} is the capital of {c} in {g}. It lies on {r}, has a long history and many museums."),
    ("What region is {c} part of?", "{c} is part of {g}. Its capital {k} is on {r}."),
    ("What is {k} known for?", "{k}, the capital of {c}, is known for its architecture along {r} and its role in {g}."),
    ("Does {r} pass through {k}?", "Yes. {r} passes through {k}, the capital of {c} in {g}."),
]


def make_rows(n: int) -> list[dict]:
    """``n`` distinct (question, answer) rows (RAG-style answers of 15-25 words)."""
    rows = []
    for i in range(n):
        c, k, g, r = _PLACES[i % len(_PLACES)]
        q, a = _TEMPLATES[(i // len(_PLACES)) % len(_TEMPLATES)]
        suffix = "" if i < len(_PLACES) * len(_TEMPLATES) else f" (variant {i // (len(_PLACES) * len(_TEMPLATES))})"
        rows.append({"question": q.format(c=c, k=k, g=g, r=r) + suffix, "answer": a.format(c=c, k=k, g=g, r=r)})
    return rows


# ------------------------------------------------------------------------ the fake server


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s*", text.strip())[0].rstrip(".!?") or "this"


_ragas_counter = iter(range(1 << 62))
_RAGAS_PREFIXES = ("What about", "Can you explain", "Tell me whether")


def bench_chat_reply(body: dict) -> str:
    """Chat responder: a valid ``{"question", "noncommittal"}`` reply to ragas's question
    prompt (both ragas APIs; one call per choice, so ``n`` choices differ), else this
    package's default responder (joint and independent prompts)."""
    messages = body.get("messages") or []
    user = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "") or ""
    if isinstance(user, str) and RAGAS_MARKER in user:
        answer = "this"
        start = user.rfind(RAGAS_INPUT)
        if start >= 0:
            try:
                data, _ = json.JSONDecoder().raw_decode(user, start + len(RAGAS_INPUT))
                answer = str(data.get("response") or answer)
            except ValueError:
                pass
        prefix = _RAGAS_PREFIXES[next(_ragas_counter) % len(_RAGAS_PREFIXES)]
        return json.dumps({"question": f"{prefix} {_first_sentence(answer)}?", "noncommittal": 0})
    return default_chat_reply(body)


def _content_text(message: dict) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def summarise(records: list[tuple[str, dict, float, float]]) -> dict:
    """Counts over recorded requests ``(kind, body, arrival_s, done_s)``.

    Tokens use :func:`relevancy_tracer_testing.count_tokens` (words and punctuation), the
    count the server also reports as ``usage.prompt_tokens``.
    """
    chat = [r for r in records if r[0] == "chat"]
    emb = [r for r in records if r[0] == "embeddings"]

    def peak(items: list) -> int:
        events = sorted([(a, 1) for _, _, a, _ in items] + [(d, -1) for _, _, _, d in items])
        level = best = 0
        for _, step in events:
            level += step
            best = max(best, level)
        return best

    def inputs(body: dict) -> list:
        value = body.get("input")
        return [value] if isinstance(value, str) else list(value or [])

    return {
        "chat_requests": len(chat),
        "embedding_requests": len(emb),
        "chat_prompt_tokens": sum(count_tokens(_content_text(m)) for _, b, _, _ in chat for m in b.get("messages") or []),
        "chat_choices": sum(int(b.get("n") or 1) for _, b, _, _ in chat),
        "embedding_texts": sum(len(inputs(b)) for _, b, _, _ in emb),
        "embedding_tokens": sum(count_tokens(t) for _, b, _, _ in emb for t in inputs(b) if isinstance(t, str)),
        "chat_peak_in_flight": peak(chat),
        "embedding_peak_in_flight": peak(emb),
    }


def _server_process(conn: Any, chat_delay: float, embedding_delay: float) -> None:
    """Child process: runs the fake server and answers ``mark`` / ``summary`` / ``stop``."""
    import relevancy_tracer_testing as testing

    timed: list[tuple[str, dict, float, float]] = []
    lock = threading.Condition()
    in_flight = [0]
    original = testing._Handler._serve

    def serve(handler: Any, owner: Any, kind: str, body: dict) -> None:
        arrival = time.monotonic()
        with lock:
            in_flight[0] += 1
        try:
            original(handler, owner, kind, body)
        finally:
            with lock:
                timed.append((kind, body, arrival, time.monotonic()))
                in_flight[0] -= 1
                lock.notify_all()

    testing._Handler._serve = serve  # type: ignore[method-assign]
    server = FakeOpenAIServer(chat_delay=chat_delay, embedding_delay=embedding_delay, chat_responder=bench_chat_reply).start()
    conn.send(server.base_url)
    while True:
        command, argument = conn.recv()
        if command == "mark":
            with lock:
                conn.send(len(timed))
        elif command == "summary":
            with lock:  # a reply reaches the client just before its handler records it
                lock.wait_for(lambda: in_flight[0] == 0, timeout=5.0)
                records = timed[argument:]
            conn.send(summarise(records))
        elif command == "stop":
            server.stop()
            conn.send(None)
            return


class ServerHandle:
    """The fake server in a child process (spawned, so no threads are forked)."""

    def __init__(self, chat_delay: float, embedding_delay: float):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_server_process, args=(child, chat_delay, embedding_delay), daemon=True)
        self._process.start()
        self.base_url: str = self._conn.recv()
        self._lock = threading.Lock()

    def _ask(self, command: str, argument: Any = None) -> Any:
        with self._lock:
            self._conn.send((command, argument))
            return self._conn.recv()

    def mark(self) -> int:
        """Index of the next request the server will record."""
        return self._ask("mark")

    def summary(self, since: int) -> dict:
        """:func:`summarise` of the requests recorded since ``since``; waits until the
        server has finished every request it received (its handlers record on completion)."""
        return self._ask("summary", since)

    def stop(self) -> None:
        try:
            self._ask("stop")
        finally:
            self._process.join(5)


# ------------------------------------------------------------------------------ variants

Scorer = Callable[[list[dict], int], "asyncio.Future[list[float]]"]


def make_relevancy_tracer(base_url: str, generation: str, strictness: int, concurrency: int) -> Callable[[list[dict]], Any]:
    """``Engine.aevaluate`` over ``rows``: returns scores (NaN for a failed evaluation)."""
    from relevancy_tracer import Engine, Settings

    settings = Settings.resolve(
        llm="openai",
        embeddings="openai",
        llm_base_url=base_url,
        llm_api_key="benchmark-key",
        llm_model=CHAT_MODEL,
        embedding_model=EMBEDDING_MODEL,
        concurrency=concurrency,
        strictness=strictness,
        generation=generation,
        method="ragas",
    )
    engine = Engine(settings)

    async def run(rows: list[dict]) -> list[float]:
        results = await engine.aevaluate(rows, concurrency=concurrency)
        return [r.score if r.ok else math.nan for r in results]

    return run


def _bounded(concurrency: int, one: Callable[[dict], Any]) -> Callable[[list[dict]], Any]:
    async def run(rows: list[dict]) -> list[float]:
        limit = asyncio.Semaphore(concurrency)

        async def guarded(row: dict) -> float:
            async with limit:
                try:
                    return float(await one(row))
                except Exception as exc:  # counted as a failed evaluation
                    print(f"  ragas evaluation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                    return math.nan

        return list(await asyncio.gather(*(guarded(r) for r in rows)))

    return run


def make_ragas_collections(base_url: str, strictness: int, concurrency: int) -> Callable[[list[dict]], Any]:
    """ragas 0.4.3's ``metrics.collections.AnswerRelevancy`` with its instructor LLM and
    modern OpenAI embeddings, both on one ``AsyncOpenAI`` client pointed at the server."""
    import openai
    from ragas.embeddings.base import embedding_factory
    from ragas.llms import llm_factory
    from ragas.metrics.collections import AnswerRelevancy

    client = openai.AsyncOpenAI(base_url=base_url, api_key="benchmark-key")
    metric = AnswerRelevancy(
        llm=llm_factory(CHAT_MODEL, client=client),
        embeddings=embedding_factory("openai", model=EMBEDDING_MODEL, client=client),
        strictness=strictness,
    )

    async def one(row: dict) -> float:
        return (await metric.ascore(user_input=row["question"], response=row["answer"])).value

    return _bounded(concurrency, one)


def make_ragas_legacy(base_url: str, strictness: int, concurrency: int) -> Callable[[list[dict]], Any]:
    """ragas 0.4.3's ``ResponseRelevancy`` (the class of ``ragas.metrics.answer_relevancy``)
    with ``LangchainLLMWrapper(ChatOpenAI)`` and ``LangchainEmbeddingsWrapper(OpenAIEmbeddings)``.
    ``check_embedding_ctx_length=False``: send text, not tiktoken ids (tiktoken would download
    its vocabulary, and the fake server embeds text)."""
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
    from ragas.dataset_schema import SingleTurnSample
    from ragas.embeddings import LangchainEmbeddingsWrapper
    from ragas.llms import LangchainLLMWrapper
    from ragas.metrics import ResponseRelevancy

    metric = ResponseRelevancy(
        llm=LangchainLLMWrapper(ChatOpenAI(model=CHAT_MODEL, base_url=base_url, api_key="benchmark-key")),
        embeddings=LangchainEmbeddingsWrapper(
            OpenAIEmbeddings(model=EMBEDDING_MODEL, base_url=base_url, api_key="benchmark-key", check_embedding_ctx_length=False)
        ),
        strictness=strictness,
    )

    async def one(row: dict) -> float:
        return await metric.single_turn_ascore(SingleTurnSample(user_input=row["question"], response=row["answer"]))

    return _bounded(concurrency, one)


def build_variant(name: str, base_url: str, strictness: int, concurrency: int) -> Callable[[list[dict]], Any]:
    if name == "rt-joint":
        return make_relevancy_tracer(base_url, "joint", strictness, concurrency)
    if name == "rt-independent":
        return make_relevancy_tracer(base_url, "independent", strictness, concurrency)
    if name == "ragas-collections":
        return make_ragas_collections(base_url, strictness, concurrency)
    if name == "ragas-legacy":
        return make_ragas_legacy(base_url, strictness, concurrency)
    raise ValueError(name)


# ------------------------------------------------------------------------------ measuring


def measure(loop: asyncio.AbstractEventLoop, server: ServerHandle, run: Callable[[list[dict]], Any], rows: list[dict]) -> dict:
    """One batch: wall-clock seconds, scores and the server's counts for exactly this batch."""
    since = server.mark()
    cpu_started = time.process_time()
    started = time.perf_counter()
    scores = loop.run_until_complete(run(rows))
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    counts = server.summary(since)
    finite = [s for s in scores if isinstance(s, float) and math.isfinite(s)]
    return {
        "seconds": seconds,
        "client_cpu_seconds": cpu_seconds,
        "evaluations": len(rows),
        "finite_scores": len(finite),
        "mean_score": statistics.fmean(finite) if finite else None,
        **counts,
    }


def aggregate(name: str, batches: list[dict]) -> dict:
    """Per-evaluation figures over every measured batch of one variant (rate: median batch)."""
    evaluations = sum(b["evaluations"] for b in batches)
    rates = [b["evaluations"] / b["seconds"] for b in batches]
    per = lambda key: sum(b[key] for b in batches) / evaluations  # noqa: E731
    return {
        "variant": name,
        "evaluations_per_second": statistics.median(rates),
        "evaluations_per_second_rounds": rates,
        "client_cpu_ms_per_evaluation": 1000.0 * per("client_cpu_seconds"),
        "client_cpu_utilisation": sum(b["client_cpu_seconds"] for b in batches) / sum(b["seconds"] for b in batches),
        "chat_requests_per_evaluation": per("chat_requests"),
        "embedding_requests_per_evaluation": per("embedding_requests"),
        "prompt_tokens_per_evaluation": per("chat_prompt_tokens"),
        "completions_per_evaluation": per("chat_choices"),
        "embedding_tokens_per_evaluation": per("embedding_tokens"),
        "chat_peak_in_flight": max(b["chat_peak_in_flight"] for b in batches),
        "embedding_peak_in_flight": max(b["embedding_peak_in_flight"] for b in batches),
        "finite_scores": sum(b["finite_scores"] for b in batches),
        "evaluations": evaluations,
        "mean_score": statistics.fmean([b["mean_score"] for b in batches if b["mean_score"] is not None]) if any(b["mean_score"] is not None for b in batches) else None,
    }


def markdown(results: dict[str, dict], ratios: dict[str, dict]) -> str:
    lines = [
        "| variant | evals/s | chat req/eval | embed req/eval | prompt tokens/eval | embed tokens/eval | client CPU ms/eval | client CPU use | peak chat / embed in flight | finite scores | mean score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        mean = "-" if r["mean_score"] is None else f"{r['mean_score']:.3f}"
        lines.append(
            f"| {name} | {r['evaluations_per_second']:.1f} | {r['chat_requests_per_evaluation']:.2f} | {r['embedding_requests_per_evaluation']:.2f} | "
            f"{r['prompt_tokens_per_evaluation']:.1f} | {r['embedding_tokens_per_evaluation']:.1f} | {r['client_cpu_ms_per_evaluation']:.1f} | "
            f"{100 * r['client_cpu_utilisation']:.0f}% | {r['chat_peak_in_flight']} / {r['embedding_peak_in_flight']} | "
            f"{r['finite_scores']}/{r['evaluations']} | {mean} |"
        )
    lines += [
        "",
        "| ratio (this / ragas) | throughput (medians) | per round (min-max) | prompt tokens | chat requests | embeddings requests | target (>= 3x throughput, <= 0.5x tokens) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key, r in ratios.items():
        if r["target_met"]:
            verdict = "met"
        else:
            missed = (["throughput"] if r["throughput"] < 3.0 else []) + (["tokens"] if r["prompt_tokens"] > 0.5 else [])
            verdict = "NOT met (" + ", ".join(missed) + ")"
        lines.append(
            f"| {key} | {r['throughput']:.2f}x | {min(r['throughput_per_round']):.2f}-{max(r['throughput_per_round']):.2f}x | "
            f"{r['prompt_tokens']:.2f}x | {r['chat_requests']:.2f}x | {r['embedding_requests']:.2f}x | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200, help="evaluations per batch (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="measured batches per variant, variants rotated per round (default 5)")
    parser.add_argument("--concurrency", type=int, default=16, help="evaluations in flight at once, every variant (default 16)")
    parser.add_argument("--strictness", type=int, default=3, help="questions generated per answer, every variant (default 3)")
    parser.add_argument("--warmup", type=int, default=16, help="unmeasured evaluations per variant before the rounds (default 16)")
    parser.add_argument("--chat-delay", type=float, default=0.1, help="seconds the server waits before every chat reply (default 0.1)")
    parser.add_argument("--embedding-delay", type=float, default=0.01, help="seconds the server waits before every embeddings reply (default 0.01)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--quick", action="store_true", help="40 rows, 1 round, 4 warm-up evaluations")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "throughput.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.rounds, args.warmup = 40, 1, 4
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}")
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # ragas's legacy API warns on every use

    rows = make_rows(args.rows)
    warm_rows = make_rows(args.rows + args.warmup)[args.rows :]
    server = ServerHandle(args.chat_delay, args.embedding_delay)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        runners = {v: build_variant(v, server.base_url, args.strictness, args.concurrency) for v in variants}
        for name, run in runners.items():  # clients, connection pools, imports
            if warm_rows:
                loop.run_until_complete(run(warm_rows))
        batches: dict[str, list[dict]] = {v: [] for v in variants}
        for round_index in range(args.rounds):
            order = variants[round_index % len(variants):] + variants[: round_index % len(variants)]
            for name in order:
                batch = measure(loop, server, runners[name], rows)
                batches[name].append(batch)
                print(f"round {round_index + 1}/{args.rounds} {name:18s} {batch['evaluations'] / batch['seconds']:7.1f} evals/s "
                      f"({batch['seconds']:.2f} s, {batch['chat_requests']} chat, {batch['embedding_requests']} embeddings requests, "
                      f"{batch['finite_scores']}/{batch['evaluations']} finite)", file=sys.stderr)
    finally:
        loop.close()
        server.stop()

    results = {v: aggregate(v, batches[v]) for v in variants}
    ratios: dict[str, dict] = {}
    for ours in ("rt-joint", "rt-independent"):
        for base in BASELINES:
            if ours in results and base in results:
                a, b = results[ours], results[base]
                throughput = a["evaluations_per_second"] / b["evaluations_per_second"]
                tokens = a["prompt_tokens_per_evaluation"] / b["prompt_tokens_per_evaluation"]
                paired = [x / y for x, y in zip(a["evaluations_per_second_rounds"], b["evaluations_per_second_rounds"])]
                ratios[f"{ours} / {base}"] = {
                    "throughput": throughput,
                    "throughput_per_round": paired,
                    "prompt_tokens": tokens,
                    "chat_requests": a["chat_requests_per_evaluation"] / b["chat_requests_per_evaluation"],
                    "embedding_requests": a["embedding_requests_per_evaluation"] / b["embedding_requests_per_evaluation"],
                    "target_met": throughput >= 3.0 and tokens <= 0.5,
                }
    all_finite = all(r["finite_scores"] == r["evaluations"] for r in results.values())
    print(markdown(results, ratios))
    print(f"\nrows {args.rows}, rounds {args.rounds}, concurrency {args.concurrency}, strictness {args.strictness}, "
          f"chat delay {args.chat_delay} s, embeddings delay {args.embedding_delay} s; every score finite: {all_finite}")

    import importlib.metadata as md

    versions = {}
    for dist in ("relevancy-tracer", "ragas", "openai", "langchain-openai", "instructor"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    payload = {
        "benchmark": "throughput",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "versions": versions,
        "parameters": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "ratios": ratios,
        "batches": batches,
        "all_scores_finite": all_finite,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all_finite else 1


if __name__ == "__main__":
    sys.exit(main())
