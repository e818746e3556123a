"""A plain `openai` chat app instrumented by one instrumentation; it never imports
relevancy_tracer. Environment: OTEL_EXPORTER_OTLP_ENDPOINT (the service), SOURCE (which
instrumentation), PROCESSOR (simple | batch). argv: the model's base URL, then a JSON list of
conversations (each a list of chat messages; the app adds the system prompt). Prints, as JSON,
the trace id of each call."""

import json
import os
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

SYSTEM = "Answer from this context only. Context: Lyon lies on the Rhone and the Saone."
source = os.environ["SOURCE"]
processor = SimpleSpanProcessor if os.environ.get("PROCESSOR") == "simple" else BatchSpanProcessor
provider = TracerProvider(resource=Resource.create({"service.name": f"{source}-app"}))
provider.add_span_processor(processor(OTLPSpanExporter()))
if source not in ("logfire", "traceloop_workflow", "traceloop_method"):  # Logfire and Traceloop install their own
    trace.set_tracer_provider(provider)
logger_provider = None

if source == "openinference_openai":
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=provider)
elif source == "openllmetry_langchain":
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    LangchainInstrumentor().instrument(tracer_provider=provider)
elif source.startswith("openllmetry"):
    from opentelemetry import _logs
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, SimpleLogRecordProcessor
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    logger_provider = LoggerProvider(resource=Resource.create({"service.name": f"{source}-app"}))
    logger_provider.add_log_record_processor((SimpleLogRecordProcessor if os.environ.get("PROCESSOR") == "simple" else BatchLogRecordProcessor)(OTLPLogExporter()))
    _logs.set_logger_provider(logger_provider)
    OpenAIInstrumentor(use_legacy_attributes=source != "openllmetry_events").instrument(tracer_provider=provider, logger_provider=logger_provider)
elif source in ("logfire", "traceloop_workflow", "traceloop_method"):
    pass  # they configure their own provider, below
elif source == "langfuse":
    pass  # set up below: Langfuse adds its span processor to this provider
elif source == "openinference_llama_index":
    pass  # instrumented below, once the index is built (indexing spans are not calls)
else:
    raise SystemExit(f"unknown SOURCE {source}")


def llama_index_app() -> None:
    """LlamaIndex over two documents: a query engine for a one-turn conversation, a context
    chat engine with the earlier turns as history otherwise. The engine's span is the trace
    root."""
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.embeddings.openai import OpenAIEmbedding
    from llama_index.llms.openai import OpenAI
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
    from opentelemetry.sdk.trace import SpanProcessor

    roots = []

    class Roots(SpanProcessor):
        def on_end(self, span):  # the trace id of each query or chat
            if span.parent is None and (span.name.endswith("QueryEngine.query") or span.name.endswith("ChatEngine.chat")):
                roots.append(format(span.context.trace_id, "032x"))

    provider.add_span_processor(Roots())
    Settings.tokenizer = lambda text: text.split()  # tiktoken would download its vocabulary
    Settings.llm = OpenAI(model="gpt-4o-mini", api_base=sys.argv[1], api_key="unused", max_retries=0)
    Settings.embed_model = OpenAIEmbedding(model="text-embedding-3-small", api_base=sys.argv[1], api_key="unused", max_retries=0)
    index = VectorStoreIndex.from_documents([Document(text="Lyon lies on the Rhone and the Saone."), Document(text="Paris is on the Seine.")])
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    from llama_index.core.llms import ChatMessage

    for conversation in json.loads(sys.argv[2]):
        if len(conversation) == 1:
            index.as_query_engine().query(conversation[-1]["content"])
        else:  # a chat engine with the earlier turns as its history
            history = [ChatMessage(role=m["role"], content=m["content"]) for m in conversation[:-1]]
            index.as_chat_engine(chat_mode="context").chat(conversation[-1]["content"], chat_history=history)
    provider.shutdown()
    print(json.dumps(roots))
    raise SystemExit(0)


def langfuse_app() -> None:
    """The Langfuse SDK on this app's TracerProvider: an ``@observe`` function calling
    ``langfuse.openai`` (a generation inside a span); its own exporter's host is the service,
    which does not serve Langfuse's ingestion path (those exports fail, as without Langfuse)."""
    from langfuse import Langfuse, observe
    from opentelemetry.sdk.trace import SpanProcessor

    roots = []

    class Roots(SpanProcessor):
        def on_end(self, span):
            if span.parent is None and span.name == "answer":
                roots.append(format(span.context.trace_id, "032x"))

    provider.add_span_processor(Roots())
    langfuse = Langfuse(public_key="pk-lf-test", secret_key="sk-lf-test", host=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], tracer_provider=provider)
    from langfuse.openai import openai as langfuse_openai

    client = langfuse_openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)

    @observe()
    def answer(messages):
        return client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "system", "content": SYSTEM}] + messages).choices[0].message.content

    for conversation in json.loads(sys.argv[2]):
        answer(conversation)
    langfuse.flush()
    provider.shutdown()
    print(json.dumps(roots))
    raise SystemExit(0)


def logfire_app() -> None:
    """Pydantic Logfire in OpenTelemetry mode (``send_to_logfire=False``: it exports to
    OTEL_EXPORTER_OTLP_ENDPOINT with its batch processor); with PROCESSOR=simple a
    SimpleSpanProcessor exports every span too, so the service receives each span twice."""
    import logfire

    extra = [SimpleSpanProcessor(OTLPSpanExporter())] if os.environ.get("PROCESSOR") == "simple" else []
    logfire.configure(send_to_logfire=False, service_name="logfire-app", console=False, additional_span_processors=extra)
    logfire.instrument_openai()
    import openai

    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
    calls = []
    for conversation in json.loads(sys.argv[2]):
        with logfire.span("handle") as parent:
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "system", "content": SYSTEM}] + conversation)
        calls.append(format(parent.get_span_context().trace_id, "032x"))
    logfire.shutdown()
    print(json.dumps(calls))
    raise SystemExit(0)


def traceloop_app() -> None:
    """The Traceloop SDK (OpenLLMetry's): ``Traceloop.init`` with its own provider and OTLP/HTTP
    exporter (``disable_batch`` with PROCESSOR=simple), an ``@workflow`` calling a ``@task``
    calling the instrumented OpenAI client: ``answer.workflow`` > ``generate.task`` >
    ``openai.chat``, the decorators' spans holding ``traceloop.entity.input`` / ``.output``
    (JSON of the arguments and return value). SOURCE=traceloop_method: the workflow is an
    unnamed ``@workflow`` method of a class (``Assistant.answer.workflow``, ``self`` among its
    arguments)."""
    from traceloop.sdk import Traceloop
    from traceloop.sdk.decorators import task, workflow
    from traceloop.sdk.instruments import Instruments

    Traceloop.init(app_name="traceloop-app", api_endpoint=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], disable_batch=os.environ.get("PROCESSOR") == "simple", telemetry_enabled=False, instruments={Instruments.OPENAI})
    import openai

    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
    calls = []

    @task(name="generate")
    def generate(messages):
        return client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "system", "content": SYSTEM}] + messages).choices[0].message.content

    @workflow(name="answer")
    def answer(messages):
        calls.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
        return generate(messages)

    class Assistant:
        def __init__(self, model):
            self.model = model

        @workflow()
        def answer(self, messages):
            calls.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))
            return generate(messages)

    assistant = Assistant("gpt-4o-mini")
    for conversation in json.loads(sys.argv[2]):
        (assistant.answer if source == "traceloop_method" else answer)(conversation)
    trace.get_tracer_provider().shutdown()
    print(json.dumps(calls))
    raise SystemExit(0)


def langchain_app() -> None:
    """A LangChain chain, ``ChatPromptTemplate | ChatOpenAI``, invoked with the question and the
    earlier turns as history, under OpenLLMetry's LangChain instrumentation: the chain's
    ``RunnableSequence.workflow`` span is the trace root (``traceloop.entity.input``
    ``{"inputs": {...}}``), with the prompt's task span and the ``ChatOpenAI.chat`` span inside."""
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_openai import ChatOpenAI
    from opentelemetry.sdk.trace import SpanProcessor

    roots = []

    class Roots(SpanProcessor):
        def on_end(self, span):
            if span.parent is None:
                roots.append(format(span.context.trace_id, "032x"))

    provider.add_span_processor(Roots())
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), MessagesPlaceholder("history"), ("human", "{question}")])
    chain = prompt | ChatOpenAI(model="gpt-4o-mini", base_url=sys.argv[1], api_key="unused", max_retries=0)
    for conversation in json.loads(sys.argv[2]):
        chain.invoke({"question": conversation[-1]["content"], "history": [(m["role"], m["content"]) for m in conversation[:-1]]})
    provider.shutdown()
    print(json.dumps(roots))
    raise SystemExit(0)


if source == "openllmetry_langchain":
    langchain_app()
if source in ("traceloop_workflow", "traceloop_method"):
    traceloop_app()
if source == "logfire":
    logfire_app()
if source == "openinference_llama_index":
    llama_index_app()
if source == "langfuse":
    langfuse_app()

import openai  # noqa: E402

assert "relevancy_tracer" not in sys.modules
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
calls = []
for conversation in json.loads(sys.argv[2]):
    with trace.get_tracer("app").start_as_current_span("handle") as parent:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "system", "content": SYSTEM}] + conversation)
    calls.append(format(parent.get_span_context().trace_id, "032x"))
provider.shutdown()
if logger_provider is not None:
    logger_provider.shutdown()
print(json.dumps(calls))
