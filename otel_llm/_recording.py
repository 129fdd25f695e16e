"""Histogram records without the SDK cleaning and hashing the same attributes again for every value.

``Histogram.record()`` costs ~10 us on these machines, most of it validating and hashing an attribute set that is
identical for every record of a series (and a stream records one value per chunk gap). For the OpenTelemetry SDK's
own histograms, with cumulative temporality and no attribute-filtering view, a ``SeriesRecorder`` lets one public
``record()`` create the series' aggregation, then adds later values of that series to it directly: the same bucket
counts, sum, min, max and exemplars, in about a quarter of the time. Anything else (another SDK, a delta-temporality
reader, a view with attribute keys, an overflowed series, internals that are not the ones checked here, a reader
added later) takes the public API. tests/test_recording.py checks that both paths produce identical points.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import time_ns
from typing import Any

from opentelemetry.context import Context

_log = logging.getLogger("otel_llm")

try:
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes
    from opentelemetry.sdk.metrics._internal.measurement import Measurement

    _INTERNALS = True
except ImportError:  # another SDK, or a release that moved them: the public API only
    _INTERNALS = False

SeriesKey = tuple[tuple[str, Any], ...]


class SeriesRecorder:
    """Records into one histogram; ``record()`` behaves as ``Histogram.record()``."""

    def __init__(self, histogram: Any) -> None:
        self._histogram = histogram
        # None once the fast path is off for good (not the SDK we know, or it failed)
        self._consumer: Any = getattr(histogram, "_measurement_consumer", None) if _INTERNALS else None
        self._storages: Any = None
        self._exemplar_filter: Any = None
        # series -> its aggregations, or () when this series must go through the public API
        self._series: dict[SeriesKey, tuple[Any, ...]] = {}

    def record(self, value: float, attributes: Mapping[str, Any], context: Context) -> None:
        key = tuple(attributes.items())
        aggregations = self._series.get(key)
        if aggregations:
            if self._consumer is not None and self._consumer._reader_storages is self._storages:
                try:
                    self._add(aggregations, value, attributes, context)
                    return
                except Exception:
                    _log.debug("otel_llm: direct histogram record failed; using the public API", exc_info=True)
                    self._consumer = None
            self._series.clear()  # readers changed (or the fast path is off): look again
            aggregations = None
        self._histogram.record(value, attributes, context=context)
        if aggregations is None and self._consumer is not None:
            self._series[key] = self._find(attributes)

    def _add(self, aggregations: tuple[Any, ...], value: float, attributes: Mapping[str, Any],
             context: Context) -> None:
        if not self._histogram._is_enabled():
            return
        time = time_ns()
        sample = self._exemplar_filter.should_sample(value, time, attributes, context)
        # no attributes on the measurement: they are the series' own, so exemplars keep none of them anyway
        measurement = Measurement(value, time, self._histogram, context, None)
        for aggregation in aggregations:
            aggregation.aggregate(measurement, sample)

    def _find(self, attributes: Mapping[str, Any]) -> tuple[Any, ...]:
        """The aggregations the public record() just used for this series, where adding to them directly is safe."""
        try:
            consumer = self._consumer
            storages = consumer._reader_storages
            if self._storages is not storages:
                self._storages = storages
                self._exemplar_filter = consumer._sdk_config.exemplar_filter
            hashed = _hash_attributes(dict(attributes))
            found = []
            for storage in storages.values():
                for match in storage._get_or_init_view_instrument_match(self._histogram):
                    if match._reset_on_collect or match._view._attribute_keys is not None:
                        return ()
                    aggregation = match._attributes_aggregation.get(hashed)
                    if aggregation is None:  # overflowed past the cardinality limit, or dropped
                        return ()
                    found.append(aggregation)
            return tuple(found)
        except Exception:
            _log.debug("otel_llm: SDK internals not as expected; histograms use the public API", exc_info=True)
            self._consumer = None
            return ()
