"""Every name otel_llm emits: metrics, units, attributes, enum values and bucket boundaries.

No other module spells a ``gen_ai.`` or ``otel_llm.`` name; dashboards, alert rules and tests import them
from here. Default names follow the OpenTelemetry GenAI semantic conventions as released in v1.41; the
``gen_ai_latest_experimental`` opt-in switches to the newer GenAI conventions repository (DESIGN.md section 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# --- attributes -----------------------------------------------------------------------------------------------

OPERATION_NAME: Final = "gen_ai.operation.name"
PROVIDER_NAME: Final = "gen_ai.provider.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_STREAM: Final = "gen_ai.request.stream"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
REQUEST_TOP_P: Final = "gen_ai.request.top_p"
REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
REQUEST_SEED: Final = "gen_ai.request.seed"
REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
REQUEST_ENCODING_FORMATS: Final = "gen_ai.request.encoding_formats"
EMBEDDINGS_DIMENSION_COUNT: Final = "gen_ai.embeddings.dimension.count"
OPENAI_REQUEST_SERVICE_TIER: Final = "openai.request.service_tier"  # when asked for, unless "auto"
OPENAI_RESPONSE_SERVICE_TIER: Final = "openai.response.service_tier"
OPENAI_RESPONSE_SYSTEM_FINGERPRINT: Final = "openai.response.system_fingerprint"
# which of the client's APIs a call went through: the conventions name two, the others are named as their paths
OPENAI_API_TYPE: Final = "openai.api.type"
OPENAI_API_CHAT_COMPLETIONS: Final = "chat_completions"
OPENAI_API_RESPONSES: Final = "responses"
OPENAI_API_COMPLETIONS: Final = "completions"
OPENAI_API_EMBEDDINGS: Final = "embeddings"
OPENAI_API_DECISIONS: Final = "decisions"
REQUEST_TOP_K: Final = "gen_ai.request.top_k"
# request parameters the conventions type as double (v1.41: top_k too); the others are int
DOUBLE_PARAMETERS: Final = frozenset((REQUEST_TEMPERATURE, REQUEST_TOP_P, REQUEST_TOP_K, REQUEST_FREQUENCY_PENALTY,
                                      REQUEST_PRESENCE_PENALTY))
OUTPUT_TYPE: Final = "gen_ai.output.type"  # when the request names an output format
OUTPUT_TEXT: Final = "text"
OUTPUT_JSON: Final = "json"  # structured output, with a schema or without
CONVERSATION_ID: Final = "gen_ai.conversation.id"  # on spans only: one value per conversation
RESPONSE_ID: Final = "gen_ai.response.id"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
TOKEN_TYPE: Final = "gen_ai.token.type"
# required on the newer conventions' usage counters; "unknown" where the count is not split by modality, as ours
TOKEN_MODALITY: Final = "gen_ai.token.modality"
TOKEN_MODALITY_UNKNOWN: Final = "unknown"
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
AWS_REQUEST_ID: Final = "aws.request_id"
# what the AWS SDK conventions put on the span of an SDK call
RPC_SYSTEM: Final = "rpc.system"
RPC_SERVICE: Final = "rpc.service"
RPC_METHOD: Final = "rpc.method"
CLOUD_REGION: Final = "cloud.region"
RPC_SYSTEM_AWS_API: Final = "aws-api"
AWS_BEDROCK_GUARDRAIL_ID: Final = "aws.bedrock.guardrail.id"

# ours
PROMPT_SIZE: Final = "otel_llm.prompt.size"
PROMPT_LENGTH: Final = "otel_llm.prompt.length"
TIME_PER_OUTPUT_TOKEN: Final = "otel_llm.response.time_per_output_token"
TIME_TO_HEADERS: Final = "otel_llm.response.time_to_headers"
MAX_CHUNK_GAP: Final = "otel_llm.response.max_chunk_gap"
CONTENT_CHUNKS: Final = "otel_llm.response.content_chunks"
RETRIES: Final = "otel_llm.request.retries"
RETRY_AFTER: Final = "otel_llm.response.retry_after"
RATE_LIMIT_RESOURCE: Final = "otel_llm.rate_limit.resource"
RATE_LIMIT_REMAINING_PREFIX: Final = "otel_llm.rate_limit.remaining."
RATE_LIMIT_LIMIT_PREFIX: Final = "otel_llm.rate_limit.limit."
USAGE_INJECTED: Final = "otel_llm.request.usage_requested"
# the provider's own account of its time, in seconds, beside ours: network and queueing are the difference
PROVIDER_LATENCY: Final = "otel_llm.response.provider_latency"
PROVIDER_TIME_TO_FIRST_BYTE: Final = "otel_llm.response.provider_time_to_first_byte"

# event names (content capture opt-in)
EVENT_OPERATION_DETAILS: Final = "gen_ai.client.inference.operation.details"

# --- enum values ----------------------------------------------------------------------------------------------

OP_CHAT: Final = "chat"
OP_TEXT_COMPLETION: Final = "text_completion"
OP_EMBEDDINGS: Final = "embeddings"

PROVIDER_OPENAI: Final = "openai"
PROVIDER_AZURE_OPENAI: Final = "azure.ai.openai"
PROVIDER_AZURE_AI_INFERENCE: Final = "azure.ai.inference"
PROVIDER_DEEPSEEK: Final = "deepseek"
PROVIDER_GROQ: Final = "groq"
PROVIDER_MISTRAL: Final = "mistral_ai"
PROVIDER_PERPLEXITY: Final = "perplexity"
PROVIDER_XAI: Final = "x_ai"
PROVIDER_ANTHROPIC: Final = "anthropic"
PROVIDER_AWS_BEDROCK: Final = "aws.bedrock"
PROVIDER_GCP_VERTEX_AI: Final = "gcp.vertex_ai"

# message content (gen-ai-input-messages.json, gen-ai-output-messages.json, gen-ai-system-instructions.json): part
# types, the roles and modalities we name ourselves, and the finish reason of an output that ended in an error
PART_TEXT: Final = "text"
PART_TOOL_CALL: Final = "tool_call"
PART_TOOL_CALL_RESPONSE: Final = "tool_call_response"
PART_REASONING: Final = "reasoning"
PART_BLOB: Final = "blob"
PART_URI: Final = "uri"
PART_FILE: Final = "file"
PART_REFUSAL: Final = "refusal"  # not one of the conventions' own: a generic part, named as OpenAI names it
ROLE_USER: Final = "user"
ROLE_ASSISTANT: Final = "assistant"
ROLE_TOOL: Final = "tool"
MODALITY_IMAGE: Final = "image"
MODALITY_AUDIO: Final = "audio"
MODALITY_VIDEO: Final = "video"
MODALITY_DOCUMENT: Final = "document"
FINISH_ERROR: Final = "error"

TOKEN_INPUT: Final = "input"
TOKEN_OUTPUT: Final = "output"

# error.type for streams that did not run to their end
ERROR_CANCELLED: Final = "cancelled"
ERROR_ABANDONED: Final = "abandoned"
# error.type values that are the caller's choice, not a failure of the provider
CALLER_ENDED_ERROR_TYPES: Final = (ERROR_CANCELLED, ERROR_ABANDONED)
# error.type values (exception class names of the clients) that mean the provider throttled the call (HTTP 429)
RATE_LIMIT_ERROR_TYPES: Final = ("RateLimitError", "ThrottlingException", "TooManyRequestsException")

RATE_LIMIT_REQUESTS: Final = "requests"
RATE_LIMIT_TOKENS: Final = "tokens"
RATE_LIMIT_INPUT_TOKENS: Final = "input_tokens"
RATE_LIMIT_OUTPUT_TOKENS: Final = "output_tokens"

# prompt-size classes in characters: (upper bound exclusive, label); the last class has no bound
PROMPT_SIZE_CLASSES: Final[tuple[tuple[int, str], ...]] = (
    (1_000, "<1k"),
    (4_000, "1k-4k"),
    (16_000, "4k-16k"),
    (64_000, "16k-64k"),
)
PROMPT_SIZE_LARGEST: Final = ">=64k"


def prompt_size_class(chars: int) -> str:
    for bound, label in PROMPT_SIZE_CLASSES:
        if chars < bound:
            return label
    return PROMPT_SIZE_LARGEST


# --- bucket boundaries ----------------------------------------------------------------------------------------

# 20 ms .. 60 s in 32 buckets about 1.3x apart, with 0.5, 1, 2 and 5 s as exact edges so SLO thresholds sit on a
# boundary. A p99 read back by histogram_quantile lands within 10% of the exact p99 for lognormal latencies with
# p99/p50 >= 2 and for heavy-tailed mixtures (tests/test_buckets.py); narrower ones fare worse (p99/p50 of 1.2:
# up to 18% here, 15% for CHUNK_BUCKETS), the price of ~30 buckets over this range.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.02, 0.0262, 0.0342, 0.0447, 0.0585, 0.0765, 0.1, 0.131, 0.171, 0.224, 0.292, 0.382, 0.5, 0.63, 0.794,
    1.0, 1.26, 1.59, 2.0, 2.52, 3.17, 3.97, 5.0, 6.59, 8.69, 11.4, 15.1, 19.9, 26.2, 34.5, 45.5, 60.0,
)
# 1 ms .. 1 s for gaps between chunks and per-token times: 2**(1/3) apart, 31 buckets, with 0.5 and 1 s exact edges
CHUNK_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.00126, 0.00159, 0.002, 0.00252, 0.00317, 0.004, 0.00504, 0.00635, 0.008, 0.0101, 0.0127, 0.016,
    0.0202, 0.0254, 0.032, 0.0403, 0.0508, 0.064, 0.0806, 0.102, 0.128, 0.161, 0.203, 0.256, 0.323, 0.406, 0.5,
    0.645, 0.813, 1.0,
)
# powers of 4 from 1, as the conventions advise for token counts
COUNT_BUCKETS: Final[tuple[float, ...]] = tuple(float(4**i) for i in range(14))


# --- metric instruments ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instrument:
    name: str
    unit: str
    description: str
    buckets: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class MetricNames:
    """One naming scheme. ``input_tokens``/``output_tokens`` split usage by type where ``token_usage`` is one
    histogram with a ``gen_ai.token.type`` attribute; ``usage_counters`` adds counters beside them."""

    duration: Instrument
    time_to_first_chunk: Instrument
    time_per_output_chunk: Instrument
    token_usage: Instrument | None
    input_tokens: Instrument | None
    output_tokens: Instrument | None
    input_token_counter: Instrument | None
    output_token_counter: Instrument | None
    time_per_output_token: Instrument
    prompt_length: Instrument
    rate_limit_remaining: Instrument
    rate_limit_limit: Instrument
    # embeddings' own duration and input tokens, where a scheme names them (None: they share the ones above, and
    # record no usage counters)
    embeddings_duration: Instrument | None = None
    embeddings_input_tokens: Instrument | None = None
    # the usage counters of the parts of input and output tokens, where a scheme names them
    cache_read_counter: Instrument | None = None
    cache_write_counter: Instrument | None = None
    reasoning_counter: Instrument | None = None


_TPOT = Instrument(
    "otel_llm.client.time_per_output_token",
    "s",
    "Per request: (last content chunk - first content chunk) / (output tokens - 1).",
    CHUNK_BUCKETS,
)
_PROMPT_LENGTH = Instrument(
    "otel_llm.client.prompt.length", "{char}", "Characters of all input text sent, measured before the call.",
    COUNT_BUCKETS,
)
_RATE_REMAINING = Instrument(
    "otel_llm.client.rate_limit.remaining", "{1}", "Rate-limit headroom the provider reported on its last response."
)
_RATE_LIMIT = Instrument(
    "otel_llm.client.rate_limit.limit", "{1}", "Rate limit the provider reported on its last response."
)

STABLE_NAMES: Final = MetricNames(
    duration=Instrument(
        "gen_ai.client.operation.duration", "s", "GenAI operation duration, request issued to response received.",
        LATENCY_BUCKETS,
    ),
    time_to_first_chunk=Instrument(
        "gen_ai.client.operation.time_to_first_chunk", "s",
        "Time from the request being issued to the first chunk that carries output content.", LATENCY_BUCKETS,
    ),
    time_per_output_chunk=Instrument(
        "gen_ai.client.operation.time_per_output_chunk", "s",
        "Gap between consecutive content chunks of a streamed response.", CHUNK_BUCKETS,
    ),
    token_usage=Instrument("gen_ai.client.token.usage", "{token}", "Number of input and output tokens used.",
                           COUNT_BUCKETS),
    input_tokens=None,
    output_tokens=None,
    input_token_counter=None,
    output_token_counter=None,
    time_per_output_token=_TPOT,
    prompt_length=_PROMPT_LENGTH,
    rate_limit_remaining=_RATE_REMAINING,
    rate_limit_limit=_RATE_LIMIT,
)

LATEST_EXPERIMENTAL_NAMES: Final = MetricNames(
    duration=Instrument(
        "gen_ai.client.inference.duration", "s", "GenAI inference duration, request issued to response received.",
        LATENCY_BUCKETS,
    ),
    time_to_first_chunk=Instrument(
        "gen_ai.client.inference.time_to_first_chunk", "s",
        "Time from the request being issued to the first chunk that carries output content.", LATENCY_BUCKETS,
    ),
    time_per_output_chunk=Instrument(
        "gen_ai.client.inference.time_per_output_chunk", "s",
        "Gap between consecutive content chunks of a streamed response.", CHUNK_BUCKETS,
    ),
    token_usage=None,
    input_tokens=Instrument("gen_ai.client.inference.operation.input_tokens", "{token}",
                            "Input tokens per operation.", COUNT_BUCKETS),
    output_tokens=Instrument("gen_ai.client.inference.operation.output_tokens", "{token}",
                             "Output tokens per operation.", COUNT_BUCKETS),
    input_token_counter=Instrument("gen_ai.client.inference.usage.input_tokens", "{token}",
                                   "Input tokens used, cached ones included."),
    output_token_counter=Instrument("gen_ai.client.inference.usage.output_tokens", "{token}",
                                    "Output tokens used, reasoning ones included."),
    cache_read_counter=Instrument("gen_ai.client.inference.usage.cache_read.input_tokens", "{token}",
                                  "Input tokens served from a provider-managed cache."),
    cache_write_counter=Instrument("gen_ai.client.inference.usage.cache_write.input_tokens", "{token}",
                                   "Input tokens written to a provider-managed cache."),
    reasoning_counter=Instrument("gen_ai.client.inference.usage.reasoning.output_tokens", "{token}",
                                 "Output tokens used for reasoning."),
    time_per_output_token=_TPOT,
    prompt_length=_PROMPT_LENGTH,
    rate_limit_remaining=_RATE_REMAINING,
    rate_limit_limit=_RATE_LIMIT,
    # client-embeddings.md: embeddings are not inference; our duration buckets, so the dashboards' sums over both
    # durations keep one set of bucket edges
    embeddings_duration=Instrument("gen_ai.client.embeddings.duration", "s",
                                   "GenAI client embeddings operation duration.", LATENCY_BUCKETS),
    embeddings_input_tokens=Instrument("gen_ai.client.embeddings.operation.input_tokens", "{token}",
                                       "Input tokens per embeddings operation.", COUNT_BUCKETS),
)

# OTEL_SEMCONV_STABILITY_OPT_IN value that selects LATEST_EXPERIMENTAL_NAMES
LATEST_EXPERIMENTAL_OPT_IN: Final = "gen_ai_latest_experimental"

INSTRUMENTATION_SCOPE: Final = "otel_llm"


# --- Prometheus names -----------------------------------------------------------------------------------------

# units as the Prometheus exporters (Python SDK, Collector) spell them in a metric name; {annotations} vanish
_PROMETHEUS_UNITS: Final[dict[str, str]] = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": ""}
_NOT_IN_LABEL: Final = re.compile(r"[^A-Za-z0-9]+")
_NOT_IN_METRIC: Final = re.compile(r"[^A-Za-z0-9:]+")


def prometheus_name(item: Instrument | str) -> str:
    """The name Prometheus sees (DESIGN.md section 5) for an instrument or an attribute key.

    Attribute keys become labels: each run of characters outside ``[A-Za-z0-9]`` becomes ``_``. Instruments become
    families: the same, keeping ``:``, plus the unit as a suffix (``s`` -> ``_seconds``; ``{token}`` adds
    nothing). Series add ``_bucket``/``_sum``/``_count`` to a histogram's family and ``_total`` to a counter's.
    """
    if isinstance(item, str):
        return _NOT_IN_LABEL.sub("_", item)
    name = _NOT_IN_METRIC.sub("_", item.name)
    unit = item.unit
    if unit.startswith("{") and unit.endswith("}"):
        unit = ""
    elif unit in _PROMETHEUS_UNITS:
        unit = _PROMETHEUS_UNITS[unit]
    else:
        raise ValueError(f"no Prometheus spelling known for unit {item.unit!r} of {item.name}")
    return f"{name}_{unit}" if unit and not name.endswith(f"_{unit}") else name
