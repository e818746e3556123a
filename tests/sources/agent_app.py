"""Small agent apps of real libraries, instrumented as their docs say; they never import
relevancy_tracer. Run by ``tests/sources/record.py`` in each library's pinned venv.

Environment: OTEL_EXPORTER_OTLP_ENDPOINT (where to export), SOURCE (the case), PROCESSOR (simple
| batch, where the app owns its TracerProvider). argv: the model's base URL, then a JSON list of
conversations (chat messages; the app adds its system prompt). Each conversation is one
user-level call (smolagents: one run per user turn, the later ones with ``reset=False``).
Prints, as JSON, a list of the user-level calls: ``{"trace_id", "question", "answer",
"roots"}`` (``roots``: the trace ids of every trace the call started; the call's own is the
last, where the instrumentation makes one trace per model call).
"""

import asyncio
import json
import os
import sys

SYSTEM = "Answer from this context only. Context: Lyon lies on the Rhone and the Saone."
TOOL_RESULT = "sunny, 21 C"
source = os.environ["SOURCE"]
base_url = sys.argv[1]
conversations = json.loads(sys.argv[2])
calls = []
loop = asyncio.new_event_loop()  # one loop for every call: async clients keep connections

roots = []
if not source.startswith("mlflow"):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    class Roots(SpanProcessor):
        """The trace id of every root span, in start order."""

        def on_start(self, span, parent_context=None):
            if span.parent is None:
                roots.append(format(span.context.trace_id, "032x"))

    processor = SimpleSpanProcessor if os.environ.get("PROCESSOR") == "simple" else BatchSpanProcessor
    provider = TracerProvider(resource=Resource.create({"service.name": f"{source}-app"}))
    provider.add_span_processor(Roots())
    provider.add_span_processor(processor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def call(question, run):
    """Run one user-level call; record its trace and the answer the app got."""
    before = len(roots)
    answer = run()
    new = roots[before:]
    calls.append({"trace_id": new[-1] if new else "", "question": question, "answer": answer, "roots": new})


def finish():
    provider.shutdown()
    print(json.dumps(calls))


def langgraph_react():
    """LangGraph's prebuilt ReAct agent with a tool, under OpenInference's LangChain
    instrumentation; invoked with the conversation as its messages."""
    from openinference.instrumentation.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument(tracer_provider=provider)
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return TOOL_RESULT

    agent = create_react_agent(
        ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="unused", max_retries=0),
        [get_weather],
        prompt=SYSTEM,
    )
    for conversation in conversations:
        messages = [(m["role"], m["content"]) for m in conversation]
        call(conversation[-1]["content"], lambda: agent.invoke({"messages": messages})["messages"][-1].content)
    finish()


def openai_agents():
    """The OpenAI Agents SDK, ``Runner.run_streamed`` (the Responses API; SOURCE=..._chat_...: Chat
    Completions), an agent with a function tool, under OpenInference's OpenAI Agents
    instrumentation."""
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    try:
        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider, exclusive_processor=True)
    except TypeError:
        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    from agents import Agent, Runner, function_tool, set_default_openai_client
    from openai import AsyncOpenAI

    set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0), use_for_tracing=False)
    if "chat" in source:  # the Chat Completions API instead of the Responses API
        from agents import set_default_openai_api

        set_default_openai_api("chat_completions")

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return TOOL_RESULT

    agent = Agent(name="Assistant", instructions=SYSTEM, model="gpt-4o-mini", tools=[get_weather])

    async def run(conversation):
        result = Runner.run_streamed(agent, input=conversation)
        async for _ in result.stream_events():
            pass
        return result.final_output

    for conversation in conversations:
        call(conversation[-1]["content"], lambda: loop.run_until_complete(run(conversation)))
    finish()


def smolagents():
    """smolagents' ToolCallingAgent with a tool, under OpenInference's smolagents
    instrumentation: one run per user turn, the later turns continuing the conversation
    (``reset=False``)."""
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        return TOOL_RESULT

    model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=base_url, api_key="unused")
    for conversation in conversations:
        agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=4, verbosity_level=0, instructions=SYSTEM)
        turns = [m["content"] for m in conversation if m["role"] == "user"]
        for i, turn in enumerate(turns):
            call(turn, lambda: str(agent.run(turn, reset=i == 0)))
    finish()


def mlflow_app():
    """MLflow tracing exporting over OTLP (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OpenAI autolog:
    SOURCE=mlflow_autolog calls the client directly (each completion its own trace; the app
    runs the tool loop), SOURCE=mlflow_traced inside an ``@mlflow.trace`` function."""
    import mlflow
    import openai

    mlflow.openai.autolog()
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]

    def answer(messages):
        messages = [{"role": "system", "content": SYSTEM}] + list(messages)
        while True:
            reply = (
                client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools).choices[0].message
            )
            if not reply.tool_calls:
                return reply.content
            messages.append(reply.model_dump(exclude_none=True))
            for tool_call in reply.tool_calls:
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": TOOL_RESULT})

    from mlflow.tracing.provider import provider as mlflow_provider
    from opentelemetry.sdk.trace import SpanProcessor

    class Roots(SpanProcessor):
        """The trace id of every root span, in start order (on MLflow's own provider)."""

        def on_start(self, span, parent_context=None):
            if span.parent is None:
                roots.append(format(span.context.trace_id, "032x"))

    mlflow_provider.get_or_init_tracer(__name__)
    mlflow_provider.get().add_span_processor(Roots())
    traced = mlflow.trace(answer)
    for conversation in conversations:
        call(conversation[-1]["content"], lambda: (traced if source == "mlflow_traced" else answer)(conversation))
    from mlflow.tracing.processor.base_mlflow import flush_all_batch_processors

    flush_all_batch_processors(terminate=True)
    mlflow_provider.get().shutdown()
    print(json.dumps(calls))


def strands():
    """Strands Agents with its native OpenTelemetry tracing (on the global provider), an
    OpenAI-compatible model (streamed chat completions) and a tool; the multi-turn call's
    earlier turns are the agent's messages."""
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        return TOOL_RESULT

    model = OpenAIModel(
        client_args={"base_url": base_url, "api_key": "unused", "max_retries": 0}, model_id="gpt-4o-mini"
    )
    for conversation in conversations:
        history = [{"role": m["role"], "content": [{"text": m["content"]}]} for m in conversation[:-1]]
        agent = Agent(model=model, tools=[get_weather], system_prompt=SYSTEM, messages=history, callback_handler=None)
        call(
            conversation[-1]["content"],
            lambda: "".join(c.get("text", "") for c in agent(conversation[-1]["content"]).message["content"]),
        )
    finish()


def semantic_kernel():
    """Semantic Kernel's OpenAI chat completion with a kernel function (auto function calling),
    its OpenTelemetry GenAI diagnostics on with sensitive data
    (SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE=true), its log events
    exported through the OpenTelemetry logging handler, as its telemetry sample does."""
    import logging

    from opentelemetry._logs import set_logger_provider
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    logger_provider = LoggerProvider(resource=Resource.create({"service.name": f"{source}-app"}))
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    set_logger_provider(logger_provider)
    handler = LoggingHandler()
    handler.addFilter(logging.Filter("semantic_kernel"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)

    from openai import AsyncOpenAI
    from semantic_kernel import Kernel
    from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
    from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion, OpenAIChatPromptExecutionSettings
    from semantic_kernel.contents import ChatHistory
    from semantic_kernel.functions import kernel_function

    class Weather:
        @kernel_function(name="get_weather", description="The weather in a city.")
        def get_weather(self, city: str) -> str:
            return TOOL_RESULT

    kernel = Kernel()
    kernel.add_plugin(Weather(), "weather")
    service = OpenAIChatCompletion(
        ai_model_id="gpt-4o-mini", async_client=AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    )
    kernel.add_service(service)
    settings = OpenAIChatPromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto())

    async def run(conversation):
        history = ChatHistory(system_message=SYSTEM)
        for m in conversation:
            (history.add_user_message if m["role"] == "user" else history.add_assistant_message)(m["content"])
        return str(await service.get_chat_message_content(history, settings, kernel=kernel))

    for conversation in conversations:
        call(conversation[-1]["content"], lambda: loop.run_until_complete(run(conversation)))
    logger_provider.shutdown()
    finish()


if source.startswith("langgraph_react"):
    langgraph_react()
elif source.startswith("openai_agents"):
    openai_agents()
elif source.startswith("smolagents"):
    smolagents()
elif source.startswith("mlflow"):
    mlflow_app()
elif source.startswith("strands"):
    strands()
elif source.startswith("semantic_kernel"):
    semantic_kernel()
else:
    raise SystemExit(f"unknown SOURCE {source}")
