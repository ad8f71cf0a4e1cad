"""``cached_property`` as Python 3.12 has it: computed on first access, then a plain attribute.

Python 3.11's ``functools.cached_property`` takes a lock on every first access; lowering and the verifier
make hundreds of thousands of small objects (access chains, access patterns) whose properties are each
read once or twice, and the lock was a fifth of that time. Nothing here shares those objects between
threads mid-construction, so the lock buys nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class cached_property(Generic[T]):  # noqa: N801 - the functools name, a drop-in
    """A non-data descriptor: the first access stores the value in the instance's ``__dict__`` (also on a
    frozen dataclass), which every later access then reads without calling back here."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, cls: type) -> cached_property[T]: ...

    @overload
    def __get__(self, obj: object, cls: type) -> T: ...

    def __get__(self, obj: object | None, cls: type) -> T | cached_property[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value
