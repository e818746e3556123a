"""Tracing a callable you do not own: ``relevancy_tracer.instrument`` on a chain's ``invoke``.

LangChain runnables (and many SDK clients) are objects whose ``invoke(input)`` returns a dict.
You cannot decorate their source, so wrap the bound method: dotted paths pick the question out
of the input dict and the answer and documents out of the result.

Run::

    python examples/langchain_style.py "What does the pass statement do?"
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import relevancy_tracer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rag_app import PythonReferenceRAG, extractive_generator  # noqa: E402


class RetrievalQAChain:
    """Stand-in for a third-party chain: ``invoke({"input": q}) -> {"answer", "context"}``."""

    def __init__(self) -> None:
        self._rag = PythonReferenceRAG(generator=extractive_generator)

    def invoke(self, inputs: dict, config: Any = None) -> dict:
        reply = self._rag.respond(inputs["input"])
        return {"input": inputs["input"], "answer": reply["answer"], "context": reply["contexts"]}


def main() -> int:
    relevancy_tracer.configure()
    chain = RetrievalQAChain()
    chain.invoke = relevancy_tracer.instrument(chain.invoke, name="RetrievalQAChain.invoke", question="inputs.input", answer="return.answer", contexts="return.context")
    for question in sys.argv[1:] or ["What does the pass statement do?"]:
        print(chain.invoke({"input": question})["answer"])
    relevancy_tracer.shutdown(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
