"""The instrumentor: ``opentelemetry-instrument`` finds it through the ``opentelemetry_instrumentor`` entry point,
and ``otel_llm.instrument()`` drives the same object."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Collection
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_llm import _semconv
from otel_llm._export import global_logger_provider, global_meter_provider, global_tracer_provider
from otel_llm._patching import Patches
from otel_llm._settings import load_settings
from otel_llm._telemetry import Telemetry
from otel_llm._version import __version__
from otel_llm.providers import ADAPTERS

_log = logging.getLogger("otel_llm")


class OtelLLMInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instruments every supported LLM client that is installed."""

    def __init__(self) -> None:
        # BaseInstrumentor is a singleton whose __init__ runs on every construction: keep the patches we hold
        if not hasattr(self, "_patches"):
            self._patches = Patches()

    def instrumentation_dependencies(self) -> Collection[str]:
        # each client is optional and checked on its own when patching
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        settings = load_settings()
        tracer_provider = kwargs.get("tracer_provider") or global_tracer_provider()
        meter_provider = kwargs.get("meter_provider") or global_meter_provider()
        logger = None
        if settings.capture_content.on_event:
            logger_provider = kwargs.get("logger_provider") or global_logger_provider()
            logger = get_logger(_semconv.INSTRUMENTATION_SCOPE, __version__, logger_provider)
        telemetry = Telemetry(
            trace.get_tracer(_semconv.INSTRUMENTATION_SCOPE, __version__, tracer_provider),
            metrics.get_meter(_semconv.INSTRUMENTATION_SCOPE, __version__, meter_provider),
            settings,
            logger,
        )
        for adapter, package in ADAPTERS.items():
            if importlib.util.find_spec(package) is None:
                continue
            try:
                module = importlib.import_module(f"otel_llm.providers.{adapter}")
            except Exception:
                _log.warning("otel_llm: cannot load the %s adapter for the installed %s; skipped", adapter, package,
                             exc_info=True)
                continue
            self._patches.apply(module.PROVIDER, telemetry)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._patches.remove()
