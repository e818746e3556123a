"""A FastAPI service answering Python questions, traced with relevancy-tracer.

The endpoint handler is decorated like any answer function: ``@relevancy_tracer.trace`` with
dotted paths into the request and response models. The span of each request carries the
answer relevancy once the background worker has scored it; the request never waits for it.

Run::

    pip install 'relevancy-tracer[local,examples]'
    uvicorn examples.web_service:app --port 8000
    curl -s localhost:8000/ask -H 'content-type: application/json' -d '{"question": "What does the pass statement do?"}'

or with forked workers (one model host serves them all)::

    gunicorn examples.web_service:app -k uvicorn_worker.UvicornWorker -w 2 --preload --bind 127.0.0.1:8000

The tracer is configured in the lifespan, so in each worker after gunicorn's fork, and shut
down there on SIGTERM (flushing the held answer spans). With ``opentelemetry-instrumentation-fastapi``
installed, FastAPI's server span of each request is the parent of its answer span
(``docs/deploying.md``; ``tests/test_deploy.py`` runs both servers).

``EXAMPLE_GENERATOR=extractive`` answers with passage sentences instead of the local LLM.
Scores are exported over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT); shutdown flushes pending ones.
"""

from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Optional

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

import relevancy_tracer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rag_app import PythonReferenceRAG, extractive_generator  # noqa: E402

rag: Optional[PythonReferenceRAG] = None  # built at startup


class AskRequest(BaseModel):
    question: str


class AskResponse(BaseModel):
    answer: str
    topics: list[str]


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    global rag
    relevancy_tracer.configure()
    extractive = os.environ.get("EXAMPLE_GENERATOR") == "extractive"
    rag = PythonReferenceRAG(generator=extractive_generator if extractive else None)
    yield
    # within gunicorn's --graceful-timeout and Kubernetes' grace period (both 30 s by default),
    # with room for the requests in flight: what is not scored by then ends with status shutdown
    relevancy_tracer.shutdown(timeout=20)


app = FastAPI(title="Python reference Q&A", lifespan=lifespan)

try:  # FastAPI's own server spans, when installed: each answer span becomes a child of its request's
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
except ImportError:  # pragma: no cover - the instrumentation is optional
    pass
else:
    FastAPIInstrumentor.instrument_app(app)


# FastAPI's decorator outermost: it registers what it wraps, so it must see the traced function
# (wrapt keeps the signature FastAPI reads the request model from).
@app.post("/ask", response_model=AskResponse)
@relevancy_tracer.trace(name="qa.ask", question="request.question", answer="return.answer")
async def ask(request: AskRequest) -> AskResponse:
    assert rag is not None, "the app has not started"
    reply = await run_in_threadpool(rag.respond, request.question)
    return AskResponse(answer=reply["answer"], topics=reply["topics"])
