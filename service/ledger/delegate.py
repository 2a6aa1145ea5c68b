"""A facade method that forwards to the same-named method of one of the ledger's parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")


class delegate(Generic[P, R]):  # noqa: N801 - used like a decorator-made method
    """``name = delegate("part", Part.name)`` on a class: ``obj.name(...)`` calls
    ``obj.part.name(...)``, with the part method's signature for the type checker."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self._part = part
        self._name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...

    @overload
    def __get__(self, obj: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type) -> Self | Callable[P, R]:
        if obj is None:
            return self
        method: Callable[P, R] = getattr(getattr(obj, self._part), self._name)
        return method
