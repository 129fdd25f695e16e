"""otel_llm: OpenTelemetry spans and histograms for LLM client calls, with one line.

    import otel_llm
    otel_llm.instrument()

Every call made through a supported client (openai, anthropic, bedrock-runtime through boto3 or aiobotocore) then
emits one CLIENT span and the GenAI metrics: operation duration, time to first chunk, time per output chunk and per
output token, token usage, prompt length and rate-limit headroom. Zero-code: ``opentelemetry-instrument python
app.py``.

Without providers of its own, the application gets OTLP export configured from the standard variables
(``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_TRACES_EXPORTER``,
``OTEL_METRICS_EXPORTER``, ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_SDK_DISABLED``). otel_llm reads:

- ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``: ``NO_CONTENT`` (default), ``SPAN_ONLY``, ``EVENT_ONLY``,
  ``SPAN_AND_EVENT``.
- ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``: the newer GenAI metric names.
- ``OTEL_LLM_STREAM_USAGE`` (default ``true``): ask for usage on streamed chat/completions and hide that extra chunk
  from the caller, so output tokens and TPOT are known.
- ``OTEL_LLM_CHUNK_GAP_SAMPLE_RATE`` (default ``1``): share of streams whose chunk gaps are all recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otel_llm._version import __version__

if TYPE_CHECKING:
    from otel_llm._instrumentor import OtelLLMInstrumentor

__all__ = ["OtelLLMInstrumentor", "__version__", "instrument", "uninstrument"]


def __getattr__(name: str) -> Any:
    # imported when first asked for, so that ``import otel_llm`` and the ``otel-llm`` command start with nothing
    # of OpenTelemetry loaded (about 0.12 s)
    if name == "OtelLLMInstrumentor":
        from otel_llm._instrumentor import OtelLLMInstrumentor

        return OtelLLMInstrumentor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None, logger_provider: Any = None) -> None:
    """Patch every supported client that is installed, when the application imports it (at once if it already has).
    A second call is a no-op (providers it passes are not used: a warning says so).

    Providers not given come from the global ones; when the application set none, from the ``OTEL_*`` variables.
    ``logger_provider`` is used only when message content goes out as events.
    """
    from otel_llm._instrumentor import OtelLLMInstrumentor

    OtelLLMInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider,
                                     logger_provider=logger_provider)


def uninstrument() -> None:
    """Remove every patch, exactly."""
    from otel_llm._instrumentor import OtelLLMInstrumentor

    instrumentor = OtelLLMInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
