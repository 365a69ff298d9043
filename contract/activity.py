"""`Activity[I, R]`: an activity's interface, declared once beside its models.

Each boundary module declares the activities that cross it, e.g. in `contract.kube`:

    QUARANTINE_DEVICE = Activity(ACT_QUARANTINE, QuarantineInput, QuarantineResult)

and both sides go through that one declaration: the activity implements it
(`@implements(QUARANTINE_DEVICE)`, activities/defn.py: mypy checks the method's input and
result against I and R) and the workflow calls it (`execute(QUARANTINE_DEVICE, inp, ...)`,
workflows/execute.py: mypy checks the argument against I and types the answer as R, which is
also the `result_type` the SDK decodes it to). A changed input or result model fails type
checking on both sides. The name is the one in `contract.names` (recorded histories match on
it: never renamed). `I` is `None` for an activity that takes no argument.

`declared_in(namespace)`: the declarations a module imported, in import order. A workflow
module imports the declarations it calls and nothing else (an unused import fails lint), so
this is the list of activities it needs, which the worker checks at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - the input model, as in Activity[I, R]
R = TypeVar("R")


@dataclass(frozen=True)
class Activity(Generic[I, R]):
    """One activity: its Temporal name, its input model and its result model."""

    name: str
    input: type[I]
    result: type[R]

    def __str__(self) -> str:
        return self.name


def declared_in(*namespaces: Mapping[str, object]) -> tuple[Activity[Any, Any], ...]:
    """Every `Activity` bound in `namespaces` (a module's `globals()` / `vars(module)`), once
    each, in order."""
    out: dict[str, Activity[Any, Any]] = {}
    for namespace in namespaces:
        for value in namespace.values():
            if isinstance(value, Activity):
                out.setdefault(value.name, value)
    return tuple(out.values())
