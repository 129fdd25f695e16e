"""One adapter per LLM client. Each knows its SDK's shapes and declares a ``PROVIDER`` patch table; the core
imports an adapter only when its client is installed, in a version we know."""

from __future__ import annotations

from otel_llm._patching import Client

# module name under otel_llm.providers -> the client it instruments
ADAPTERS: dict[str, Client] = {
    "openai": Client("openai", "openai", min_version=(1, 92), below_version=(4,)),
    "anthropic": Client("anthropic", "anthropic", min_version=(2, 14), below_version=(3,)),
    "bedrock": Client("botocore", "botocore", min_version=(1, 34), below_version=(2,)),
    "aiobotocore": Client("aiobotocore", "aiobotocore", min_version=(2, 25), below_version=(4,)),
}
