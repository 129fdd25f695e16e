"""Export set-up for applications that configured no OpenTelemetry providers: OTLP from the standard ``OTEL_*``
variables. An application that set its own global providers keeps them untouched; one that set only a tracer
provider, or only a meter provider, has chosen for the other signal too (tracing only, say): it is not set up."""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger_provider, set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_log = logging.getLogger("otel_llm")


def nothing_configured() -> bool:
    """Whether the application has set neither global provider (the API's placeholders are still in place)."""
    return (isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
            and type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider")


def global_tracer_provider(set_up: bool) -> trace.TracerProvider:
    """The global tracer provider; with ``set_up``, an OTLP one first if the application set none."""
    provider = trace.get_tracer_provider()
    if set_up and isinstance(provider, trace.ProxyTracerProvider) and _enabled():
        provider = TracerProvider(resource=Resource.create())
        exporter = _span_exporter()
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return provider


def global_meter_provider(set_up: bool) -> metrics.MeterProvider:
    """The global meter provider; with ``set_up``, an OTLP one first if the application set none."""
    provider = metrics.get_meter_provider()
    # the API's placeholder until an application sets one
    if set_up and type(provider).__name__ == "_ProxyMeterProvider" and _enabled():
        provider = MeterProvider(resource=Resource.create(), metric_readers=_metric_readers())
        metrics.set_meter_provider(provider)
    return provider


def global_logger_provider() -> Any:
    """Only asked for when content goes out as events."""
    provider = get_logger_provider()
    if type(provider).__name__ == "ProxyLoggerProvider" and _enabled():
        exporter, protocol = _choice("LOGS")
        provider = LoggerProvider(resource=Resource.create())
        if exporter == "console":
            provider.add_log_record_processor(BatchLogRecordProcessor(ConsoleLogRecordExporter()))
        elif exporter != "none":
            provider.add_log_record_processor(BatchLogRecordProcessor(_otlp_log_exporter(protocol)))
        set_logger_provider(provider)
    return provider


def _otlp_log_exporter(protocol: str) -> Any:
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
        except ImportError:
            _log.warning("otel_llm: OTLP over gRPC needs `pip install otel-llm[grpc]`; using http/protobuf")
        else:
            return GrpcLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    return OTLPLogExporter()


def _enabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"


# the Python SDK's own exporter names that pin the OTLP protocol (its opentelemetry_*_exporter entry points)
_OTLP_NAMES = {"otlp_proto_grpc": "grpc", "otlp_proto_http": "http/protobuf"}


def _choice(signal: str) -> tuple[str, str]:
    exporter = os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp").split(",")[0].strip().lower() or "otlp"
    protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if exporter in _OTLP_NAMES:
        return "otlp", _OTLP_NAMES[exporter]
    return exporter, protocol


def _span_exporter() -> Any:
    exporter, protocol = _choice("TRACES")
    if exporter == "none":
        return None
    if exporter == "console":
        return ConsoleSpanExporter()
    if exporter != "otlp":
        _log.warning("otel_llm: OTEL_TRACES_EXPORTER=%s is not supported here; using otlp", exporter)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
        except ImportError:
            _log.warning("otel_llm: OTLP over gRPC needs `pip install otel-llm[grpc]`; using http/protobuf")
        else:
            return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _metric_readers() -> list[Any]:
    if _choice("METRICS")[0] == "prometheus":
        return _prometheus_reader()
    exporter = _metric_exporter()
    return [PeriodicExportingMetricReader(exporter)] if exporter is not None else []


def _prometheus_reader() -> list[Any]:
    """A scrape endpoint, as the SDK's own configuration makes one (OTEL_EXPORTER_PROMETHEUS_HOST / _PORT)."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        _log.warning("otel_llm: OTEL_METRICS_EXPORTER=prometheus needs `pip install otel-llm[prometheus]`; "
                     "metrics are not exported")
        return []
    host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST") or "localhost"
    port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT") or "9464"
    try:
        start_http_server(port=int(port), addr=host)
    except (OSError, ValueError):
        _log.warning("otel_llm: cannot serve Prometheus metrics on %s:%s; metrics are not exported", host, port,
                     exc_info=True)
        return []
    return [PrometheusMetricReader()]


def _metric_exporter() -> Any:
    exporter, protocol = _choice("METRICS")
    if exporter == "none":
        return None
    if exporter == "console":
        return ConsoleMetricExporter()
    if exporter != "otlp":
        _log.warning("otel_llm: OTEL_METRICS_EXPORTER=%s is not supported here; using otlp", exporter)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )
        except ImportError:
            _log.warning("otel_llm: OTLP over gRPC needs `pip install otel-llm[grpc]`; using http/protobuf")
        else:
            return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()
