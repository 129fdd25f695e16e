"""The one place that catches our own failures: logged once per site, never raised into the user's code.

The test suite sets ``OTEL_LLM_STRICT=1`` so that our bugs fail tests instead of hiding.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Final

logger: Final = logging.getLogger("otel_llm")

_reported: set[str] = set()
strict: bool = os.environ.get("OTEL_LLM_STRICT") == "1"


def report_failure(where: str) -> None:
    """Call from an ``except Exception`` block around our own code only (never around the user's call). An exception
    the application's signal handler raised (a signal-based timeout), which Python runs between any two bytecodes,
    ours included, is the caller's: it goes on."""
    if strict or _raised_by_signal_handler(sys.exc_info()[1]):
        raise  # the exception being handled: the caller's, or under tests our bug, which must fail loudly
    if where not in _reported:
        _reported.add(where)
        logger.warning("otel_llm: internal failure in %s; telemetry for this call is incomplete", where,
                       exc_info=True)


def reraise_if_signalled() -> None:
    """Call in an ``except Exception`` block that handles a failure without reporting it (a fallback taken, a value
    left unread), before it handles it: an exception the application's signal handler raised is the caller's, and
    goes on."""
    if _raised_by_signal_handler(sys.exc_info()[1]):
        raise


def _raised_by_signal_handler(error: BaseException | None) -> bool:
    """Whether one of the Python signal handlers set now is among the frames ``error`` came through."""
    if error is None:
        return False
    handlers = set()
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None:
            handlers.add(code)
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code in handlers:
            return True
        traceback = traceback.tb_next
    return False
