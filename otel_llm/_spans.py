"""Span attributes set at the finish without the SDK cleaning values we built clean.

``Span.set_attributes()`` runs every value through the SDK's generic cleaning (a recursive type walk, a copy of the
mapping, a locked insert each): about a quarter of all our own work on a non-streamed call. Our finish attributes
are plain already: str, bool, int, float, or a tuple of str. For the OpenTelemetry SDK's own spans with no
attribute value length limit and room under the attribute count limit, ``set_attributes`` writes them into the
span's attribute store under the span's and the store's locks, as the SDK would: an attribute set again moves to
the end. Anything else (another SDK's span, a length limit to apply, a full store, an ended span, a value that is
not plain, internals that are not the ones checked here) takes the public API. tests/test_spans.py checks both
paths give identical spans.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

_log = logging.getLogger("otel_llm")

try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Span as SdkSpan

    _direct = True
except ImportError:  # another SDK: the public API only
    _direct = False

_PLAIN = frozenset((str, bool, int, float))


def set_attributes(span: Any, attributes: Mapping[str, Any]) -> None:
    """``span.set_attributes(attributes)``."""
    if _direct and isinstance(span, SdkSpan) and _plain(attributes):
        try:
            if _write(span, attributes):
                return
        except Exception:
            _off()
    span.set_attributes(attributes)


def _write(span: Any, attributes: Mapping[str, Any]) -> bool:
    store = span._attributes
    if type(store) is not BoundedAttributes or store.max_value_len is not None:
        return False
    with span._lock:
        if span._end_time is not None:  # ended: the public API warns
            return False
        with store._lock:
            values = store._dict
            if store._immutable or (store.maxlen is not None and len(values) + len(attributes) > store.maxlen):
                return False
            for key in values.keys() & attributes.keys():
                del values[key]
            values.update(attributes)
    return True


def _plain(attributes: Mapping[str, Any]) -> bool:
    """Keys non-empty str; values str, bool, int, float or a tuple of str."""
    if set(map(type, attributes)) - {str} or "" in attributes:
        return False
    values = list(attributes.values())
    kinds = list(map(type, values))
    if set(kinds) <= _PLAIN:
        return True
    if set(kinds) - _PLAIN != {tuple}:
        return False
    tuples = compress(values, map(is_, kinds, repeat(tuple)))
    return set(map(type, chain.from_iterable(tuples))) <= {str}


def _off() -> None:
    global _direct
    _log.debug("otel_llm: SDK span internals not as expected; span attributes use the public API", exc_info=True)
    _direct = False
