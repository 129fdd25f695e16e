"""A table of patch targets -> wrap / unwrap. ``apply`` and ``remove`` are exact inverses; a target that the installed
SDK does not have is skipped. A client version outside the range we know is skipped whole, with a warning, before
its adapter is imported (an adapter imports its client's types, which a much older client may not have)."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import wrapt

if TYPE_CHECKING:
    from otel_llm._calls import Wrapper
    from otel_llm._telemetry import Telemetry

_log = logging.getLogger("otel_llm")


@dataclass(frozen=True, slots=True)
class Target:
    module: str
    attribute: str  # "Class.method"
    make: Callable[[Telemetry], Wrapper]


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    targets: Sequence[Target]


@dataclass(frozen=True, slots=True)
class Client:
    """An instrumented client as installed: its import package, its distribution on PyPI, the versions we know."""

    package: str
    distribution: str
    min_version: tuple[int, ...]
    below_version: tuple[int, ...]  # first version we have not checked

    def supported(self) -> bool:
        """Whether the installed release is one we know; a warning if it is not."""
        version = _installed_version(self.distribution)
        if version is None:  # imported from somewhere pip does not know of
            _log.debug("otel_llm: no version of %s installed; not instrumenting it", self.distribution)
            return False
        if self.min_version <= version < self.below_version:
            return True
        _log.warning(
            "otel_llm: %s %s is outside the versions otel_llm supports (>=%s, <%s); not instrumenting it",
            self.distribution, ".".join(map(str, version)), ".".join(map(str, self.min_version)),
            ".".join(map(str, self.below_version)),
        )
        return False


@dataclass(slots=True)
class _Applied:
    owner: Any
    name: str
    original: Any
    had_own: bool
    wrapper: Any


class Patches:
    def __init__(self) -> None:
        self._applied: list[_Applied] = []

    def apply(self, provider: Provider, telemetry: Telemetry) -> int:
        """Patch every target of ``provider`` that the installed client has; returns how many were patched."""
        count = 0
        wrapped_by: dict[str, str] = {}  # another library's wrapper module -> a method it wraps
        for target in provider.targets:
            try:
                module = importlib.import_module(target.module)
                *path, name = target.attribute.split(".")
                owner: Any = module
                for part in path:
                    owner = getattr(owner, part)
                original = getattr(owner, name)
            except (ImportError, AttributeError):
                _log.debug("otel_llm: %s.%s not found in this %s; skipped", target.module, target.attribute,
                           provider.name)
                continue
            had_own = name in vars(owner)
            if had_own:
                original = vars(owner)[name]  # the raw descriptor, so restoring is exact
            theirs = _wrapper_module(original)
            if theirs is not None and not name.startswith("_"):
                wrapped_by.setdefault(theirs, target.attribute)
            wrapper = wrapt.FunctionWrapper(original, target.make(telemetry))
            setattr(owner, name, wrapper)
            self._applied.append(_Applied(owner, name, original, had_own, wrapper))
            count += 1
        for theirs, attribute in wrapped_by.items():
            _log.warning("otel_llm: %s's %s is already wrapped by %s; if that is another instrumentation recording "
                         "GenAI telemetry, each call is recorded twice: keep one", provider.name, attribute,
                         theirs)
        return count

    def remove(self) -> None:
        while self._applied:
            applied = self._applied.pop()
            if vars(applied.owner).get(applied.name) is not applied.wrapper:
                _log.warning("otel_llm: %s.%s was re-patched by someone else; leaving it in place",
                             getattr(applied.owner, "__qualname__", applied.owner), applied.name)
                continue
            if applied.had_own:
                setattr(applied.owner, applied.name, applied.original)
            else:
                delattr(applied.owner, applied.name)


def _wrapper_module(method: Any) -> str | None:
    """The module of another library's wrapt wrapper around ``method`` (how instrumentations patch), if any."""
    if not isinstance(method, wrapt.FunctionWrapper):
        return None
    module = getattr(getattr(method, "_self_wrapper", None), "__module__", None)
    return module if isinstance(module, str) and module.split(".")[0] != "otel_llm" else None


def _installed_version(distribution: str) -> tuple[int, ...] | None:
    try:
        raw = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    parts: list[int] = []
    for piece in raw.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)
