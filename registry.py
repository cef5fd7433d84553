"""A small registry type for codecs, formats and bridges: register by name, aliases, extensions.

A failed lookup lists the valid names; an entry whose dependency is missing stays
registered with the hint that explains how to install it (HuggingFace's formatter
registry does the same), so ``--help`` can still list it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from unihub.errors import MissingDependencyError, UnsupportedFormatError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names (and aliases, file extensions) to entries of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._extensions: dict[str, str] = {}
        self._unavailable: dict[str, str] = {}

    def register(
        self, name: str, *, aliases: tuple[str, ...] = (), extensions: tuple[str, ...] = ()
    ) -> Callable[[T], T]:
        """Decorator: ``@registry.register("png", aliases=("image",))``."""

        def add(entry: T) -> T:
            self.add(name, entry, aliases=aliases, extensions=extensions)
            return entry

        return add

    def add(
        self, name: str, entry: T, *, aliases: tuple[str, ...] = (), extensions: tuple[str, ...] = ()
    ) -> None:
        """Register ``entry`` under ``name``; re-registering a name replaces it."""
        self._entries[name] = entry
        self._unavailable.pop(name, None)
        for alias in aliases:
            self._aliases[alias] = name
        for ext in extensions:
            self._extensions[ext.lower().lstrip(".")] = name

    def add_unavailable(self, name: str, hint: str) -> None:
        """Keep ``name`` known although its dependency is missing; lookups raise ``hint``."""
        if name not in self._entries:
            self._unavailable[name] = hint

    def names(self) -> list[str]:
        """Every registered name, available or not, sorted."""
        return sorted(set(self._entries) | set(self._unavailable))

    def canonical(self, name: str) -> str:
        """The registered name for ``name`` or one of its aliases."""
        return self._aliases.get(name, name)

    def get(self, name: str) -> T:
        """The entry for ``name`` or an alias; unknown names list the valid ones."""
        key = self.canonical(name)
        if key in self._entries:
            return self._entries[key]
        if key in self._unavailable:
            raise MissingDependencyError(self._unavailable[key])
        raise UnsupportedFormatError(
            f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
        )

    def by_extension(self, extension: str) -> str | None:
        """The name registered for a file extension (``'.png'`` or ``'png'``), if any."""
        return self._extensions.get(extension.lower().lstrip("."))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.canonical(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))
