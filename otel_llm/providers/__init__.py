"""One adapter per LLM client. Each knows its SDK's shapes and declares a ``PROVIDER`` patch table; the core
imports an adapter only when its client is installed."""

from __future__ import annotations

# module name under otel_llm.providers -> the top-level package of the client it instruments
ADAPTERS: dict[str, str] = {
    "openai": "openai",
    "anthropic": "anthropic",
    "bedrock": "botocore",
}
