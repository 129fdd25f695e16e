"""Runs inside a throwaway venv holding one client release (tests/test_client_versions.py builds it, with the work
tree on PYTHONPATH): calls every scenario through the real client against a loopback server before instrument(),
instrumented, and after uninstrument(), and prints what the caller and the in-memory exporters saw as one JSON
object. It judges nothing: the test does, against each scenario's `Span`."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import wire
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_llm
from otel_llm import _semconv as sc
from otel_llm._patching import Provider, Target

INSTRUMENT_ONLY = "--instrument-only"  # argument: call no scenario, report only what instrument() did
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Span:
    """The one span an operation must end with (DESIGN.md section 4), and so the histogram points it adds."""

    operation: str
    model: str
    provider: str
    stream: bool
    response_model: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reasons: tuple[str, ...] | None = None
    retries: int | None = None
    error: str | None = None
    more: Mapping[str, Any] = field(default_factory=dict)  # provider-specific, e.g. rate-limit headroom

    @property
    def name(self) -> str:
        return f"{self.operation} {self.model}"

    def attributes(self, port: int) -> dict[str, Any]:
        """Attribute -> value as the JSON report spells it; None: the attribute must be absent."""
        return {
            sc.OPERATION_NAME: self.operation,
            sc.PROVIDER_NAME: self.provider,
            sc.REQUEST_MODEL: self.model,
            sc.REQUEST_STREAM: self.stream,
            sc.RESPONSE_MODEL: self.response_model,
            sc.RESPONSE_ID: self.response_id,
            sc.USAGE_INPUT_TOKENS: self.input_tokens,
            sc.USAGE_OUTPUT_TOKENS: self.output_tokens,
            sc.RESPONSE_FINISH_REASONS: None if self.finish_reasons is None else list(self.finish_reasons),
            sc.RETRIES: self.retries,
            sc.SERVER_ADDRESS: LOOPBACK,
            sc.SERVER_PORT: port,
            sc.ERROR_TYPE: self.error,
            **self.more,
        }

    def points(self) -> dict[str, int]:
        """Histogram -> points added: one duration, one time to first chunk if streamed, one per known token count."""
        names = sc.STABLE_NAMES
        assert names.token_usage is not None
        return {
            names.duration.name: 1,
            names.time_to_first_chunk.name: int(self.stream),
            names.token_usage.name: (self.input_tokens is not None) + (self.output_tokens is not None),
        }


@dataclass(frozen=True)
class Scenario:
    name: str
    call: Callable[[wire.LoopbackServer], Any]  # returns what the caller got; a coroutine is run to its end
    span: Span | None  # None: not an LLM operation, nothing may be recorded


def main(provider: Provider, scenarios: Sequence[Scenario], answer: wire.ReplySource) -> None:
    with wire.LoopbackServer(answer) as server:
        report = _drive(provider, () if INSTRUMENT_ONLY in sys.argv[1:] else scenarios, server)
    json.dump(report, sys.stdout)


def _drive(provider: Provider, scenarios: Sequence[Scenario], server: wire.LoopbackServer) -> dict[str, Any]:
    warnings = _Warnings()
    logging.getLogger("otel_llm").addHandler(warnings)
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    histograms = _Histograms()

    def observe(scenario: Scenario) -> dict[str, Any]:
        caller = _call(scenario, server)
        finished = [_span(span) for span in spans.get_finished_spans()]
        spans.clear()
        return {**caller, "spans": finished, "points": histograms.added(), "warnings": warnings.take()}

    original = {target: _own(target) for target in provider.targets}
    baseline = [observe(scenario) for scenario in scenarios]
    otel_llm.instrument(tracer_provider=tracer_provider, meter_provider=histograms.provider)
    patched = {target: _own(target) for target in provider.targets}
    instrument_warnings = warnings.take()
    instrumented = [observe(scenario) for scenario in scenarios]
    otel_llm.uninstrument()
    restored = {target: _own(target) for target in provider.targets}
    uninstrument_warnings = warnings.take()
    after = [observe(scenario) for scenario in scenarios]
    return {
        "port": urlsplit(server.base_url).port,
        "instrument_warnings": instrument_warnings,
        "uninstrument_warnings": uninstrument_warnings,
        "targets": {
            f"{target.module}:{target.attribute}": {
                "present": original[target] is not _ABSENT,
                "patched": patched[target] is not original[target],
                "restored": restored[target] is original[target],
            }
            for target in provider.targets
        },
        "scenarios": {
            scenario.name: {"baseline": phases[0], "instrumented": phases[1], "uninstrumented": phases[2]}
            for scenario, *phases in zip(scenarios, baseline, instrumented, after, strict=True)
        },
    }


def _plain(value: Any) -> Any:
    """What the caller got, as JSON values: SDK models dumped, bytes decoded; anything else must already be JSON."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", warnings=False)  # parse() results warn of their generic types
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, bytes):
        return value.decode()
    return value


def _call(scenario: Scenario, server: wire.LoopbackServer) -> dict[str, Any]:
    try:
        result = scenario.call(server)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        return {"caller": _plain(result), "error": None}
    except Exception as error:  # the test says which scenario failed on this release, and how
        return {"caller": None, "error": f"{type(error).__name__}: {error}"}


def _span(span: Any) -> dict[str, Any]:
    return {"name": span.name, "kind": span.kind.name, "status": span.status.status_code.name,
            "attributes": dict(span.attributes or {})}


_ABSENT = object()


def _own(target: Target) -> Any:
    """What instrument() replaces: the class's own attribute (None when it inherits it), or _ABSENT."""
    *path, name = target.attribute.split(".")
    try:
        owner: Any = importlib.import_module(target.module)
        for part in path:
            owner = getattr(owner, part)
        getattr(owner, name)
    except (ImportError, AttributeError):
        return _ABSENT
    return vars(owner).get(name)


class _Warnings(logging.Handler):
    """otel_llm's log records at WARNING and above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self._messages.append(record.getMessage())

    def take(self) -> list[str]:
        taken, self._messages = self._messages, []
        return taken


class _Histograms:
    """Points recorded per histogram, read through the SDK's in-memory reader as deltas between calls."""

    def __init__(self) -> None:
        self._reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self._reader])
        self._counted: dict[str, int] = {}

    def added(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        data = self._reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data is not None else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if isinstance(metric.data, Histogram):
                        points = sum(point.count for point in metric.data.data_points)
                        counts[metric.name] = counts.get(metric.name, 0) + points
        added = {name: count - self._counted.get(name, 0) for name, count in counts.items()}
        self._counted = counts
        return {name: count for name, count in added.items() if count}
