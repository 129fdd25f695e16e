"""Environment read once into a frozen object. A bad value logs a warning and falls back to the default."""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from otel_llm import _semconv

_log = logging.getLogger("otel_llm")

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
STREAM_USAGE_ENV = "OTEL_LLM_STREAM_USAGE"
GAP_SAMPLE_RATE_ENV = "OTEL_LLM_CHUNK_GAP_SAMPLE_RATE"


class CaptureContent(enum.Enum):
    NO_CONTENT = "NO_CONTENT"
    SPAN_ONLY = "SPAN_ONLY"
    EVENT_ONLY = "EVENT_ONLY"
    SPAN_AND_EVENT = "SPAN_AND_EVENT"

    # plain attributes of each member, not properties: read on every call, where a property costs several times more
    enabled: bool
    on_span: bool
    on_event: bool

    def __init__(self, value: str) -> None:
        self.enabled = value != "NO_CONTENT"
        self.on_span = value in ("SPAN_ONLY", "SPAN_AND_EVENT")
        self.on_event = value in ("EVENT_ONLY", "SPAN_AND_EVENT")


@dataclass(frozen=True, slots=True)
class Settings:
    capture_content: CaptureContent = CaptureContent.NO_CONTENT
    # ask OpenAI-style servers for usage on streams (stream_options.include_usage) and hide that extra chunk
    stream_usage: bool = True
    # share of streams whose every chunk gap goes into the per-chunk histogram (benchmarks/README.md)
    chunk_gap_sample_rate: float = 1.0
    metric_names: _semconv.MetricNames = _semconv.STABLE_NAMES


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    default = Settings()
    return Settings(
        capture_content=_capture_content(env.get(CAPTURE_CONTENT_ENV), default.capture_content),
        stream_usage=_boolean(STREAM_USAGE_ENV, env.get(STREAM_USAGE_ENV), default.stream_usage),
        chunk_gap_sample_rate=_rate(env.get(GAP_SAMPLE_RATE_ENV), default.chunk_gap_sample_rate),
        metric_names=_metric_names(env.get(SEMCONV_OPT_IN_ENV)),
    )


def _capture_content(raw: str | None, default: CaptureContent) -> CaptureContent:
    if raw is None or not raw.strip():
        return default
    value = raw.strip().upper()
    # the older boolean form of this variable is still common
    if value in ("TRUE", "1"):
        return CaptureContent.SPAN_ONLY
    if value in ("FALSE", "0"):
        return CaptureContent.NO_CONTENT
    try:
        return CaptureContent(value)
    except ValueError:
        _warn(CAPTURE_CONTENT_ENV, raw, default.value)
        return default


def _boolean(name: str, raw: str | None, default: bool) -> bool:
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    _warn(name, raw, str(default).lower())
    return default


def _rate(raw: str | None, default: float) -> float:
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        _warn(GAP_SAMPLE_RATE_ENV, raw, str(default))
        return default
    return value


def _metric_names(raw: str | None) -> _semconv.MetricNames:
    options = {part.strip() for part in (raw or "").split(",")}
    if _semconv.LATEST_EXPERIMENTAL_OPT_IN in options:
        return _semconv.LATEST_EXPERIMENTAL_NAMES
    # other instrumentations read this variable too: only a GenAI option we do not know is ours to name
    unknown = sorted(option for option in options if option.startswith("gen_ai"))
    if unknown:
        _log.warning("otel_llm: ignoring %s in %s=%r (the GenAI option is %s); using the stable names",
                     ", ".join(unknown), SEMCONV_OPT_IN_ENV, raw, _semconv.LATEST_EXPERIMENTAL_OPT_IN)
    return _semconv.STABLE_NAMES


def _warn(name: str, raw: str, default: str) -> None:
    _log.warning("otel_llm: ignoring %s=%r (not a valid value); using %s", name, raw, default)
