"""`@defn(NAME)`: Temporal's `activity.defn(name=NAME)`, recording NAME on the function as
`activity_name` too — the public attribute the worker's registration check reads (the SDK keeps
its definition in a private attribute), so the worker can tell which activities it registers
without reaching into the SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity

F = TypeVar("F", bound=Callable[..., Any])

NAME_ATTRIBUTE = "activity_name"


def defn(name: str) -> Callable[[F], F]:
    def register(fn: F) -> F:
        defined = activity.defn(name=name)(fn)
        setattr(defined, NAME_ATTRIBUTE, name)
        return defined

    return register


def name_of(fn: Callable[..., Any]) -> str | None:
    """The activity name `@defn` recorded on `fn` (a function or a bound method), else None."""
    name = getattr(fn, NAME_ATTRIBUTE, None)
    return name if isinstance(name, str) else None
