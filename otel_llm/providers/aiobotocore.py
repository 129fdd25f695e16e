"""aiobotocore's ``bedrock-runtime`` client, and so aioboto3's: the Bedrock adapter's operations, results and events,
through aiobotocore's own ``_make_api_call`` and endpoint hooks (see providers/bedrock.py)."""

from __future__ import annotations

from otel_llm.providers.bedrock import AIO_PROVIDER as PROVIDER

__all__ = ["PROVIDER"]
