"""The one place that catches our own failures: logged once per site, never raised into the user's code.

The test suite sets ``OTEL_LLM_STRICT=1`` so that our bugs fail tests instead of hiding.
"""

from __future__ import annotations

import logging
import os
from typing import Final

logger: Final = logging.getLogger("otel_llm")

_reported: set[str] = set()
strict: bool = os.environ.get("OTEL_LLM_STRICT") == "1"


def report_failure(where: str) -> None:
    """Call from an ``except Exception`` block around our own code only (never around the user's call)."""
    if strict:
        raise  # the exception being handled: under tests our bugs must fail loudly
    if where not in _reported:
        _reported.add(where)
        logger.warning("otel_llm: internal failure in %s; telemetry for this call is incomplete", where,
                       exc_info=True)
