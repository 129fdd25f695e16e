"""Export set-up for applications that configured no OpenTelemetry providers: OTLP from the standard ``OTEL_*``
variables. An application that set its own global providers keeps them untouched."""

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


def global_tracer_provider() -> trace.TracerProvider:
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider) and _enabled():
        provider = TracerProvider(resource=Resource.create())
        exporter = _span_exporter()
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return provider


def global_meter_provider() -> metrics.MeterProvider:
    provider = metrics.get_meter_provider()
    # the API's placeholder until an application sets one
    if type(provider).__name__ == "_ProxyMeterProvider" and _enabled():
        exporter = _metric_exporter()
        readers = [PeriodicExportingMetricReader(exporter)] if exporter is not None else []
        provider = MeterProvider(resource=Resource.create(), metric_readers=readers)
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


def _choice(signal: str) -> tuple[str, str]:
    exporter = os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp").split(",")[0].strip().lower() or "otlp"
    protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
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
