"""`@implements(DECL)`: an activity method implementing its declaration
(`contract.activity.Activity[I, R]`).

It is Temporal's `activity.defn(name=DECL.name)`, typed so that mypy holds the method to the
declaration: it must take the declared input model and answer the declared result
(`async def method(self, inp: I) -> R`; for an input-less declaration, `def method(self) -> R`,
run on the worker's thread pool). The name is also recorded on the function as
`activity_name`, the public attribute the worker's registration check reads (the SDK keeps its
definition in a private attribute), so the worker can tell which activities it registers
without reaching into the SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from temporalio import activity

from contract.activity import Activity

I = TypeVar("I")  # noqa: E741 - the input model, as in Activity[I, R]
R = TypeVar("R")
S = TypeVar("S")  # the activity class
F = TypeVar("F", bound=Callable[..., Any])

NAME_ATTRIBUTE = "activity_name"


def implements(
    decl: Activity[I, R],
) -> Callable[[Callable[[S, I], Coroutine[Any, Any, R]]], Callable[[S, I], Coroutine[Any, Any, R]]]:
    """`@implements(DECL)` on `async def method(self, inp: I) -> R`."""
    return _register(decl.name)


def implements_blocking(decl: Activity[None, R]) -> Callable[[Callable[[S], R]], Callable[[S], R]]:
    """`@implements_blocking(DECL)` on `def method(self) -> R` of an input-less declaration: a
    sync activity, run on the worker's thread pool (file reads)."""
    return _register(decl.name)


def _register(name: str) -> Callable[[F], F]:
    def register(fn: F) -> F:
        defined = activity.defn(name=name)(fn)
        setattr(defined, NAME_ATTRIBUTE, name)
        return defined

    return register


def name_of(fn: Callable[..., Any]) -> str | None:
    """The activity name `@implements` recorded on `fn` (a function or a bound method), else
    None."""
    name = getattr(fn, NAME_ATTRIBUTE, None)
    return name if isinstance(name, str) else None
