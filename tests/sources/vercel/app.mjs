// A Vercel AI SDK app (generateText, or streamText for SOURCE=..._stream, with
// experimental_telemetry); it never talks to
// relevancy-tracer except through OTLP. Environment: OTEL_EXPORTER_OTLP_ENDPOINT (the service),
// SOURCE (vercel_ai: the SDK's own ai.* spans; openinference_vercel: through
// @arizeai/openinference-vercel's span processor), PROCESSOR (simple | batch).
// argv: the model's base URL, then a JSON list of conversations (chat messages; the app adds
// the system prompt). Prints, as JSON, the trace id of each call.
import { trace } from "@opentelemetry/api";
import { BatchSpanProcessor, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { Resource } from "@opentelemetry/resources";
import { OpenInferenceBatchSpanProcessor, OpenInferenceSimpleSpanProcessor } from "@arizeai/openinference-vercel";
import { generateText, streamText } from "ai";
import { createOpenAI } from "@ai-sdk/openai";

const SYSTEM = "Answer from this context only. Context: Lyon lies on the Rhone and the Saone.";
const [baseURL, conversations] = process.argv.slice(2);
const stream = process.env.SOURCE.endsWith("_stream"); // streamText instead of generateText
const source = process.env.SOURCE.replace(/_stream$/, "");
const simple = process.env.PROCESSOR === "simple";
const exporter = new OTLPTraceExporter();
const processor = source === "openinference_vercel"
  ? (simple ? new OpenInferenceSimpleSpanProcessor({ exporter }) : new OpenInferenceBatchSpanProcessor({ exporter }))
  : (simple ? new SimpleSpanProcessor(exporter) : new BatchSpanProcessor(exporter));
const provider = new NodeTracerProvider({ resource: new Resource({ "service.name": `${source}-app` }) });
provider.addSpanProcessor(processor);
provider.register();
const openai = createOpenAI({ baseURL, apiKey: "unused" });
const calls = [];
for (const messages of JSON.parse(conversations)) {
  await trace.getTracer("app").startActiveSpan("handle", async (span) => {
    const call = { model: openai.chat("gpt-4o-mini"), system: SYSTEM, messages, maxRetries: 0, experimental_telemetry: { isEnabled: true } };
    if (stream) await streamText(call).text;
    else await generateText(call);
    calls.push(span.spanContext().traceId);
    span.end();
  });
}
await provider.shutdown();
console.log(JSON.stringify(calls));
