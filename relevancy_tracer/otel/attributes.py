"""Attribute, event and instrument names.

OpenInference (https://github.com/Arize-ai/openinference, semantic conventions) for the span's
kind and content; the OpenTelemetry GenAI semantic conventions for the evaluation event
(``gen_ai.evaluation.result``, stability: development); ``relevancy.*`` for this library's
results.
"""

# --- OpenInference
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
SPAN_KIND_CHAIN = "CHAIN"
SPAN_KIND_EVALUATOR = "EVALUATOR"
INPUT_VALUE = "input.value"
OUTPUT_VALUE = "output.value"
RETRIEVAL_DOCUMENT_CONTENT = "retrieval.documents.{index}.document.content"

# --- GenAI semantic conventions: evaluation event
GEN_AI_EVALUATION_RESULT = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
EVALUATION_NAME = "answer_relevancy"

# --- relevancy results
SCORE = "relevancy.score"
RAW_SCORE = "relevancy.raw_score"
CALIBRATED = "relevancy.calibrated"
EVALUATOR_VERSION = "relevancy.evaluator.version"
LABEL = "relevancy.label"
EXPLANATION = "relevancy.explanation"
#: Why an answer labelled below directly_addresses failed: echo, hedge, evasive, off_topic,
#: padded, incomplete, other (relevancy_tracer.scoring.failure). Also a metric attribute.
FAILURE_KIND = "relevancy.failure_kind"
#: The calibrated score's evidence (natural-log likelihood ratio, prior-free) and its prior.
EVIDENCE = "relevancy.evidence"
PRIOR = "relevancy.prior"
STATUS = "relevancy.status"
ERROR = "relevancy.error"
ERROR_TYPE = "relevancy.error.type"
METHOD = "relevancy.method"
COMPONENT = "relevancy.components.{name}"
FAILED_COMPONENTS = "relevancy.failed_components"
GENERATED_QUESTIONS = "relevancy.generated_questions"
SIMILARITIES = "relevancy.similarities"
NONCOMMITTAL = "relevancy.noncommittal"
SUB_QUESTIONS = "relevancy.sub_questions"
SUB_QUESTIONS_ADDRESSED = "relevancy.sub_questions_addressed"
INTENT = "relevancy.intent"
#: With a conversation: the last turn rewritten as a standalone question (content), the earlier
#: turns read, and whether a history was read or given in no known shape (``read`` / ``invalid``).
STANDALONE_QUESTION = "relevancy.question.standalone"
HISTORY_TURNS = "relevancy.history.turns"
HISTORY_STATUS = "relevancy.history.status"
STRICTNESS = "relevancy.strictness"
#: set when the model wrote fewer questions than ``strictness`` (the score uses those it wrote)
GENERATED_QUESTIONS_COUNT = "relevancy.generated_questions.count"
LLM_MODEL = "relevancy.llm.model"
EMBEDDING_MODEL = "relevancy.embedding.model"
LATENCY_MS = "relevancy.latency_ms"
INPUT_TOKENS = "relevancy.usage.input_tokens"
OUTPUT_TOKENS = "relevancy.usage.output_tokens"
TRUNCATED = "relevancy.truncated"
EXTRACTION_ERROR = "relevancy.extraction.error"
#: Why a call was not scored: queue_full / shutdown / thread_start_failed (dropped),
#: trace_not_recorded (not_sampled), exception / awaitable_returned / iterator_returned /
#: abandoned_stream (skipped), stream_closed_early (incomplete), CancelledError / GeneratorExit
#: (cancelled).
STATUS_REASON = "relevancy.status.reason"
#: The evaluation's id: 32 hex digits, a hash of (trace id, span id, method); also the Phoenix
#: annotation's identifier.
EVALUATION_ID = "relevancy.evaluation.id"
#: The service's: milliseconds the job waited between the receiver taking the span and its
#: scoring starting.
QUEUE_WAIT_MS = "relevancy.queue.wait_ms"
#: The service's: the name of the span an EVALUATOR span scores.
EVALUATED_SPAN_NAME = "relevancy.evaluated_span.name"

# --- metric instruments and their attributes
METRIC_SCORE = "relevancy.score"
METRIC_EVALUATIONS = "relevancy.evaluations"
METRIC_DURATION = "relevancy.evaluation.duration"
METRIC_QUEUE_DEPTH = "relevancy.queue.depth"
METRIC_SAMPLE_RATIO = "relevancy.admission.ratio"
METRIC_CAPACITY = "relevancy.admission.capacity"
METRIC_HISTORY = "relevancy.history"
ATTR_SPAN_NAME = "span.name"
ATTR_SERVICE_NAME = "service.name"

#: Histogram buckets of scores, over [0, 1] (the SDK's default buckets put every score in one).
SCORE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Histogram buckets of evaluation durations, in seconds (local models take 5-60 s).
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
