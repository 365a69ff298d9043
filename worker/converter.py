"""The data converter of every Sickbay client, worker and replayer: the SDK's pydantic converter
(`temporalio.contrib.pydantic`), with the runbook set converted once per distinct value.

Every remediation's first workflow task loads the runbooks (a local activity) and every node
incident and maintenance does too: the worker encodes the same set (about 15 KB of JSON) as
the activity's result and decodes and validates it again in the workflow, about 4 ms of CPU
each time on a 2-core machine (about a tenth of a storm's worker CPU per remediation), by far
the largest value a remediation converts. The set changes only when a runbook file does, so
its payload is kept beside the set (encoded once per loaded set) and its decoded value beside
the payload's bytes (validated once per distinct set): the bytes are the key, so a replay on
any worker decodes exactly what history holds, and the history is byte for byte what the
plain converter writes.

A decoded set is shared by the workflows that read the same bytes, so it must never change:
`RunbookSet` and every model in it are frozen, their sequences tuples; only the match's two
label maps stay dicts, read by selector matching and written by nothing
(tests/workflows/test_converter.py reads every field's type).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import (
    PydanticJSONPlainPayloadConverter,
    PydanticPayloadConverter,
)
from temporalio.converter import DataConverter

from contract.runbook import RunbookSet

SHARED_TYPES: tuple[type, ...] = (RunbookSet,)
"""Values converted once per distinct value: immutable, and the same for many workflows."""

KEEP = 8
"""Distinct values (and payloads) kept per direction: a worker sees one runbook set at a time,
and a few more across an edit and the replays of runs older than it."""


class _Memo:
    """A small least-recently-used map, safe across the worker's threads."""

    def __init__(self) -> None:
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > KEEP:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


# id(value) -> (value, payload data); the value is kept, so its id is not reused meanwhile.
ENCODED = _Memo()
# (type, payload data) -> the decoded value.
DECODED = _Memo()


class _SharedJSON(PydanticJSONPlainPayloadConverter):
    def to_payload(self, value: Any) -> Payload | None:
        if type(value) not in SHARED_TYPES:
            return super().to_payload(value)
        hit = ENCODED.get(id(value))
        if hit is not None and hit[0] is value:
            data: bytes = hit[1]
        else:
            payload = super().to_payload(value)
            assert payload is not None  # JSON takes every model
            data = payload.data
            ENCODED.put(id(value), (value, data))
        return Payload(metadata={"encoding": self.encoding.encode()}, data=data)

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        if type_hint not in SHARED_TYPES:
            return super().from_payload(payload, type_hint)
        key = (type_hint, payload.data)
        value = DECODED.get(key)
        if value is None:
            value = super().from_payload(payload, type_hint)
            DECODED.put(key, value)
        return value


class SharedValuePayloadConverter(PydanticPayloadConverter):
    """The SDK's pydantic payload converter, its JSON part converting `SHARED_TYPES` once per
    distinct value."""

    def __init__(self) -> None:
        super().__init__()
        shared = _SharedJSON()
        self.converters = {
            encoding: shared if encoding == shared.encoding.encode() else c
            for encoding, c in self.converters.items()
        }


DATA_CONVERTER = DataConverter(payload_converter_class=SharedValuePayloadConverter)
"""What every Temporal client of Sickbay's uses (and so its workers and replayers)."""
