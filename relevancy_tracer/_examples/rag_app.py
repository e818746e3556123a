"""A small, real RAG app over Python's language reference, traced with relevancy-tracer.

* Corpus: the language reference topics CPython ships as ``pydoc_data.topics`` (what
  ``help("with")`` prints), split into passages. Offline, no download.
* Retrieval: passages and question embedded with the embedded multilingual USE; cosine top-k.
  Passage vectors are cached under the user's cache directory.
* Generation: the embedded Qwen2.5-Coder-1.5B answers from the retrieved passages only, or says
  it does not know; when no passage is similar enough the app says so without calling the LLM.
  ``--extractive`` answers with the best passage's opening sentences instead (fast, no LLM).

``PythonReferenceRAG.answer`` is decorated with ``@relevancy_tracer.trace``: every call gets a
span, and its answer relevancy is scored in the background and attached to it.

Run::

    python examples/rag_app.py "What does the with statement do?"
    python examples/rag_app.py --extractive            # the built-in questions, no LLM generation

Scores print as they arrive; spans go to OTEL_EXPORTER_OTLP_ENDPOINT (default localhost:4318).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

import relevancy_tracer

#: The embedded models of the app's own retrieval and generation (the scorer's defaults).
EMBEDDING_MODEL = "use-multilingual-v3"
LLM_MODEL = "qwen2.5-coder-1.5b"

#: Questions the reference answers, and questions it cannot (a careful app says it does not know).
QUESTIONS = (
    "What does the with statement do?",
    "What is the capital of Australia?",
    "When does the else clause of a for loop run?",
    "What is the difference between the is operator and the == operator?",
    "How do I install numpy on Windows?",
    "What does the pass statement do?",
    "What does the global statement do?",
    "Who won the 2022 FIFA World Cup?",
    "How do you write a lambda expression?",
)

UNKNOWN = "I don't know: the Python language reference does not cover that."


@dataclass(frozen=True)
class Passage:
    """A passage of the reference: its topic (``help()`` key) and text."""

    topic: str
    text: str


def load_passages(chunk_chars: int = 800, max_chars_per_topic: int = 4000) -> list[Passage]:
    """The reference's topics split into paragraphs merged up to ``chunk_chars`` characters;
    at most ``max_chars_per_topic`` characters of each topic (the opening, where the
    definition is) keep the index small."""
    from pydoc_data.topics import topics

    passages = []
    for topic, text in sorted(topics.items()):
        text = text[:max_chars_per_topic]
        chunk = ""
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = paragraph.strip()
            if not paragraph:
                continue
            if chunk and len(chunk) + len(paragraph) > chunk_chars:
                passages.append(Passage(topic, chunk))
                chunk = ""
            chunk = f"{chunk}\n\n{paragraph}" if chunk else paragraph
        if chunk:
            passages.append(Passage(topic, chunk))
    return passages


_generator_model = None


def _app_llm():
    """The embedded LLM for the app's own answers: with ``local_host`` (the default) the model
    host's model, the one the scorer uses (one llama.cpp context on the machine, whose decoder
    batches the app's generations with the scorer's requests); else an in-process instance of
    its own, with ``RAG_APP_THREADS`` CPU threads (default: all cores)."""
    global _generator_model
    if _generator_model is None:
        threads = int(os.environ["RAG_APP_THREADS"]) if os.environ.get("RAG_APP_THREADS") else None
        _generator_model = relevancy_tracer.local_chat_model(LLM_MODEL, threads=threads)
    return _generator_model


def default_cache_dir() -> Path:
    """relevancy-tracer's cache directory, as the package chooses it: ``RELEVANCY_TRACER_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/relevancy-tracer`` (default ``~/.cache/relevancy-tracer``)."""
    explicit = os.environ.get("RELEVANCY_TRACER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relevancy-tracer"


def local_generator(question: str, passages: Sequence[str]) -> str:
    """Answer with the embedded local LLM from ``passages`` only (about 10-20 s on 2 cores)."""
    context = "\n\n---\n\n".join(passages)
    messages = [
        {
            "role": "system",
            "content": "You answer questions about the Python language using only the reference excerpts given. "
            "Answer in two or three sentences. If the excerpts do not contain the answer, reply exactly: "
            + UNKNOWN,
        },
        {"role": "user", "content": f"Reference excerpts:\n{context}\n\nQuestion: {question}"},
    ]
    return _app_llm().generate(messages, max_tokens=160)


def extractive_generator(question: str, passages: Sequence[str]) -> str:
    """Answer with the first sentences of the best passage (no LLM)."""
    best = re.sub(r"\s+", " ", passages[0]).strip()
    sentences = re.split(r"(?<=[.!?])\s+", best)
    return " ".join(sentences[:3])


class PythonReferenceRAG:
    """Retrieval-augmented answers from Python's language reference.

    Args:
        generator: ``fn(question, passages) -> answer``; default :func:`local_generator`.
        top_k: passages retrieved per question.
        min_similarity: cosine below which a passage is not used (no passage left: the app
            answers :data:`UNKNOWN` without generating).
        cache_dir: where passage vectors are cached (default: relevancy-tracer's cache dir).
    """

    def __init__(self, generator: Optional[Callable[[str, Sequence[str]], str]] = None, top_k: int = 3, min_similarity: float = 0.35, cache_dir: Optional[Path] = None):
        self.generator = generator or local_generator
        self.top_k = top_k
        self.min_similarity = min_similarity
        self.embedder = relevancy_tracer.local_embedder(EMBEDDING_MODEL)  # the model host's, by default
        self.passages = load_passages()
        digest = hashlib.sha256("\x00".join(p.text for p in self.passages).encode()).hexdigest()[:16]
        cache = (cache_dir or default_cache_dir() / "examples") / f"pydoc-passages-{self.embedder.name}-{digest}.npy"
        if cache.exists():
            self.vectors = np.load(cache)
        else:
            self.vectors = self.embedder.embed_sync([p.text for p in self.passages])
            cache.parent.mkdir(parents=True, exist_ok=True)
            # written whole, then renamed: forked workers starting together never read half a file
            partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
            with open(partial, "wb") as handle:
                np.save(handle, self.vectors)
            os.replace(partial, cache)

    def retrieve(self, question: str) -> list[tuple[Passage, float]]:
        """The ``top_k`` passages most similar to ``question``, with their cosine similarity."""
        query = self.embedder.embed_sync([question])[0]
        sims = self.vectors @ query
        best = np.argsort(-sims)[: self.top_k]
        return [(self.passages[i], float(sims[i])) for i in best]

    @relevancy_tracer.trace(name="python_docs_rag.answer")
    def answer(self, question: str) -> dict:
        """Traced :meth:`respond`: the call's span gets its answer relevancy."""
        return self.respond(question)

    def respond(self, question: str) -> dict:
        """``{"answer": str, "contexts": [passage texts], "topics": [topic names]}`` (untraced)."""
        hits = [(p, s) for p, s in self.retrieve(question) if s >= self.min_similarity]
        if not hits:
            return {"answer": UNKNOWN, "contexts": [], "topics": []}
        contexts = [p.text for p, _ in hits]
        return {"answer": self.generator(question, contexts), "contexts": contexts, "topics": [p.topic for p, _ in hits]}


def print_outcome(outcome: relevancy_tracer.EvaluationOutcome) -> None:
    """An ``on_result`` hook printing each score as it arrives."""
    result = outcome.result
    score = f"{result.score:.3f} {result.label}" if result is not None and result.ok else outcome.status
    print(f"  scored: {score}  [{(outcome.question or '')[:60]}]  trace {outcome.trace_id}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Ask Python's language reference; answers are traced and scored.")
    parser.add_argument("questions", nargs="*", help="questions (default: the built-in mix)")
    parser.add_argument("--extractive", action="store_true", help="answer with passage sentences instead of the LLM")
    args = parser.parse_args(argv)
    relevancy_tracer.configure(on_result=print_outcome)
    rag = PythonReferenceRAG(generator=extractive_generator if args.extractive else None)
    for question in args.questions or QUESTIONS:
        reply = rag.answer(question)
        print(f"Q: {question}\nA: {reply['answer']}\n", flush=True)
    print("waiting for the last scores...", flush=True)
    relevancy_tracer.shutdown(timeout=600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
