"""The instrumentor: ``opentelemetry-instrument`` finds it through the ``opentelemetry_instrumentor`` entry point,
and ``otel_llm.instrument()`` drives the same object."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any

import wrapt
from opentelemetry import metrics, trace
from opentelemetry._logs import get_logger
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_llm import _semconv
from otel_llm._export import Providers, nothing_configured, sdk_enabled
from otel_llm._patching import Client, Patches
from otel_llm._safety import reraise_if_signalled
from otel_llm._settings import load_settings
from otel_llm._telemetry import Telemetry, set_live_telemetry, stop_later_writer
from otel_llm._version import __version__
from otel_llm.providers import ADAPTERS

_log = logging.getLogger("otel_llm")


class OtelLLMInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instruments every supported LLM client that is installed."""

    def __init__(self) -> None:
        # BaseInstrumentor is a singleton whose __init__ runs on every construction: keep the patches we hold
        if not hasattr(self, "_patches"):
            self._patches = Patches()
            # what import hooks patch with; None once uninstrumented (hooks of clients never imported stay
            # registered, and must not keep a Telemetry, its meter's state and providers alive)
            self._telemetry: Telemetry | None = None
            # bumped by uninstrument(): import hooks registered before it then do nothing
            self._generation = 0
            # the providers in use, by instrument()'s argument names
            self._providers: dict[str, Any] = {}

    def instrument(self, **kwargs: Any) -> Any:
        """One call instruments at a time, holding no lock while it runs (it imports, and an import may wait on
        another thread). Another thread's call waits for it to be done (in time); a call from within it (an import
        hook it set off) or from a thread in the middle of an import returns at once."""
        if not _claim():
            return None
        try:
            if self.is_instrumented_by_opentelemetry:  # by an earlier call, or the one this one waited for
                if any(kwargs.get(key) is not None and kwargs[key] is not self._providers.get(key)
                       for key in _PROVIDER_KEYS):
                    _log.warning("otel_llm: already instrumented (by opentelemetry-instrument or an earlier "
                                 "instrument()); the providers passed now are not used. Call "
                                 "otel_llm.uninstrument() first to change them")
                return None
            result = super().instrument(**kwargs)
            if self._telemetry is None:  # the set-up failed (logged): not instrumented, a later call may try again
                self._is_instrumented_by_opentelemetry = False
            return result
        finally:
            _release()

    def uninstrument(self, **kwargs: Any) -> Any:
        if not _claim():
            return None
        try:
            if not self.is_instrumented_by_opentelemetry:
                return None
            return super().uninstrument(**kwargs)
        finally:
            _release()

    def instrumentation_dependencies(self) -> Collection[str]:
        # each client is optional and checked on its own when patching
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        try:
            self._set_up(**kwargs)
        except Exception:  # providers that raise, a broken install: the application runs on, uninstrumented
            self._uninstrument()
            reraise_if_signalled()
            _log.warning("otel_llm: cannot set up its telemetry; not instrumenting", exc_info=True)
        except BaseException:  # Ctrl-C in the middle: nothing half done stays
            self._uninstrument()
            raise

    def _set_up(self, **kwargs: Any) -> None:
        if not sdk_enabled():  # the SDK records nothing: patching would only change requests (the usage request)
            _log.info("otel_llm: OTEL_SDK_DISABLED is true; not instrumenting")
            return
        settings = load_settings()
        # before either is set up here; a provider passed is a set-up of the application's own too
        set_up = nothing_configured() and not (kwargs.get("tracer_provider") or kwargs.get("meter_provider"))
        on_event = settings.capture_content.on_event
        providers = Providers(set_up, with_logs=on_event and not kwargs.get("logger_provider"))
        try:
            tracer_provider = kwargs.get("tracer_provider") or providers.tracer_provider
            meter_provider = kwargs.get("meter_provider") or providers.meter_provider
            if (isinstance(tracer_provider, trace.NoOpTracerProvider)
                    and isinstance(meter_provider, metrics.NoOpMeterProvider) and not on_event):
                # the application chose to record nothing: as under OTEL_SDK_DISABLED, patching would only change
                # requests. Not instrumented, so a later instrument() with working providers is one
                _log.info("otel_llm: the tracer and meter providers are the API's no-op ones; not instrumenting")
                providers.discard()
                return
            logger = None
            if on_event:
                logger_provider = kwargs.get("logger_provider") or providers.logger_provider
                logger = get_logger(_semconv.INSTRUMENTATION_SCOPE, __version__, logger_provider)
            telemetry = Telemetry(
                trace.get_tracer(_semconv.INSTRUMENTATION_SCOPE, __version__, tracer_provider),
                metrics.get_meter(_semconv.INSTRUMENTATION_SCOPE, __version__, meter_provider),
                settings,
                logger,
            )
        except BaseException:
            providers.discard()
            raise
        providers.install()
        self._telemetry = telemetry
        set_live_telemetry(telemetry)
        self._providers = {"tracer_provider": tracer_provider, "meter_provider": meter_provider,
                           "logger_provider": kwargs.get("logger_provider")}
        # A client is patched when the application imports it (at once if it already has): instrument() does not
        # import clients the application never uses (botocore and anthropic alone take ~1 s).
        for adapter, client in ADAPTERS.items():
            package = client.package
            if importlib.util.find_spec(package) is None:
                continue
            patch = self._when_imported(adapter, client)
            wrapt.register_post_import_hook(patch, package)
            if package not in sys.modules and _being_imported(package):
                # another thread is importing it, past the point where it would have seen the hook: wait for that
                # import (importing it here blocks until it is done), then patch; if it failed, there is nothing to
                with contextlib.suppress(ImportError):
                    patch(importlib.import_module(package))
        _warn_of_twins()

    def _when_imported(self, adapter: str, client: Client) -> Callable[[ModuleType], None]:
        generation = self._generation
        once = threading.Lock()

        def patch(_: ModuleType) -> None:
            telemetry = self._telemetry
            if self._generation != generation or telemetry is None or not once.acquire(blocking=False):
                return  # uninstrumented since, or patched already
            try:
                if client.supported():
                    module = importlib.import_module(f"otel_llm.providers.{adapter}")
                    patched = self._patches.apply(module.PROVIDER, telemetry)
                    _log.debug("otel_llm: instrumented %s (%d methods)", client.package, patched)
            except Exception:  # never into the application's import
                reraise_if_signalled()
                _log.warning("otel_llm: cannot instrument the installed %s; skipped", client.package, exc_info=True)

        return patch

    def _uninstrument(self, **kwargs: Any) -> None:
        self._generation += 1
        if self._telemetry is not None:
            self._telemetry.retired = True
        set_live_telemetry(None)
        stop_later_writer()
        self._telemetry = None
        self._providers = {}
        self._patches.remove()


_PROVIDER_KEYS = ("tracer_provider", "meter_provider", "logger_provider")
# opentelemetry_instrumentor entry points of other instrumentations that record the same calls as GenAI telemetry
# (OpenTelemetry's openai-v2 registers as "openai", OpenLLMetry's as "openai", "anthropic" and "bedrock")
_TWINS = frozenset(("openai", "openai_v2", "anthropic", "bedrock"))


def _warn_of_twins() -> None:
    """Under ``opentelemetry-instrument``, which loads every installed instrumentation in an order of its own: say
    which others will record the same calls (two spans per call, gen_ai metrics twice over)."""
    if "opentelemetry.instrumentation.auto_instrumentation" not in sys.modules:
        return
    disabled = {name.strip() for name in os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")}
    if "*" in disabled:
        return
    try:  # (entry-point name, its distribution)
        twins = sorted({(entry.name, entry.dist.name if entry.dist else entry.value)
                        for entry in importlib.metadata.entry_points(group="opentelemetry_instrumentor")
                        if entry.name in _TWINS and entry.name not in disabled})
    except Exception:  # metadata we cannot read: nothing to say
        reraise_if_signalled()
        return
    if twins:
        _log.warning("otel_llm: opentelemetry-instrument also loads %s, which records the same LLM calls: each "
                     "would be recorded twice. Keep one: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=%s",
                     ", ".join(f"{name} ({distribution})" for name, distribution in twins),
                     ",".join(sorted({name for name, _ in twins})))


# The thread running instrument() or uninstrument() now, and what tells the others it is done; _CLAIM guards both
# and is held only to look and claim.
_CLAIM = threading.Lock()
_claimer: int | None = None
_claim_done = threading.Event()
_claim_done.set()
_WAIT_S = 10.0  # how long another thread's call waits for one under way


def _claim() -> bool:
    """Whether this thread may run instrument()/uninstrument() now, after another thread's call under way; False
    when its own call is under way, or when it cannot wait: it is in the middle of an import (which the other
    call may be waiting on), or the other call is not done in time."""
    global _claimer, _claim_done
    me = threading.get_ident()
    while True:
        with _CLAIM:
            if _claimer is None:
                _claimer, _claim_done = me, threading.Event()
                return True
            if _claimer == me:
                return False
            done = _claim_done
        if _importing_here() or not done.wait(_WAIT_S):
            return False


def _release() -> None:
    global _claimer
    with _CLAIM:
        _claimer = None
        _claim_done.set()


def _importing_here() -> bool:
    """Whether this thread is in the middle of an import (holds a module's import lock)."""
    me = threading.get_ident()
    for found in list(_module_locks().values()):
        lock = found() if callable(found) else found
        if getattr(lock, "owner", None) == me:
            return True
    return False


def _after_fork() -> None:
    """The claiming thread does not survive a fork: the child starts with no claim and a fresh lock."""
    global _CLAIM, _claimer, _claim_done
    _CLAIM, _claimer, _claim_done = threading.Lock(), None, threading.Event()
    _claim_done.set()


os.register_at_fork(after_in_child=_after_fork)


def _being_imported(name: str) -> bool:
    """Whether some thread holds the import lock of module ``name`` (it is being imported right now)."""
    return name in _module_locks()


def _module_locks() -> dict[str, Any]:
    """The import system's locks of modules being imported now, by name; none where its internals differ."""
    locks = getattr(getattr(importlib, "_bootstrap", None), "_module_locks", None)
    return locks if isinstance(locks, dict) else {}
