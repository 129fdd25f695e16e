"""The ``otel-llm`` console script. The command line is imported inside ``main()``, so that Ctrl-C while it loads
(OpenTelemetry's SDK, the simulator: some 0.15 s) ends with one line, as it does once the command runs."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` is Ctrl-C: a KeyboardInterrupt, or one that Python 3.11 wrapped in a RuntimeError because
    it came while a class being defined called ``__set_name__`` (pydantic's models, as the openai client loads)."""
    return isinstance(error, KeyboardInterrupt) or (
        isinstance(error, RuntimeError) and isinstance(error.__cause__, KeyboardInterrupt))


def main() -> int:
    try:
        from otel_llm import cli
    except (KeyboardInterrupt, RuntimeError) as error:
        if not interrupted(error):
            raise
        print("otel-llm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return cli.main()
