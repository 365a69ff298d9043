"""The base of every boundary model: `Contract`, durations (`Duration`, `parse_duration`,
`format_duration`), `StrictBool`, the strict base of what people send (`PersonInput`, with
`PersonDuration` and `PersonTime`) and `input_problems` (one line naming every bad field).
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    Strict,
    TypeAdapter,
    ValidationError,
)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> Any:
    """Accept `90`, `"90s"`, `"5m"`, `"1h30m"`, `"2d"` as well as ISO 8601 / timedelta."""
    if isinstance(value, timedelta):
        return value
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return timedelta(seconds=value)
        if isinstance(value, str):
            parsed = _parse_text(value.strip())
            if parsed is not None:
                return parsed
    except OverflowError:  # e.g. 1e20 seconds: a validation error, not a crash
        raise ValueError(f"duration {value!r} is out of range") from None
    return value  # let pydantic try ISO 8601 and report a clear error


@functools.lru_cache(maxsize=512)
def _parse_text(text: str) -> timedelta | None:
    """`5m` -> 5 minutes (None: not this notation). Cached: every runbook set decoded in a
    workflow parses the same few dozen durations again."""
    if re.fullmatch(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+", text):
        unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
        total = sum(float(n) * unit[u] for n, u in _DURATION_PART.findall(text))
        return timedelta(seconds=total)
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    return None


def _compound(seconds: float) -> str:
    """`1h30m`, `6m24s`, `2.5s`: hours, minutes and seconds as people write them (what
    `parse_duration` reads back), the zero parts left out."""
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{int(hours)}h"] if hours else []
    parts += [f"{int(minutes)}m"] if minutes else []
    if secs or not parts:
        parts.append(f"{secs:.6f}".rstrip("0").rstrip(".") + "s")
    return sign + "".join(parts)


def format_duration(value: timedelta) -> str:
    """`5m`, `1h30m`, `6m24.138s`: how durations read in the Web UI and in JSON; exact, so it
    reads back to the same value."""
    return _compound(value.total_seconds())


def human_duration(value: timedelta) -> str:
    """A duration for people (timelines, escalations, the CLI): `6m24s`, `1h30m`, `2.5s`,
    `300ms`; to the second from 10 s on, a tenth below, milliseconds under one second."""
    seconds = value.total_seconds()
    if 0 < abs(seconds) < 1:
        return f"{round(seconds * 1000)}ms"
    return _compound(round(seconds, 1) if abs(seconds) < 10 else round(seconds))


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A duration written as `30s`, `5m`, `1h30m` or seconds; serialised back as `5m`."""

# A JSON boolean only: `"dry_run": "true"` (or "yes", 1) is refused with a clear error rather
# than coerced, so a launch typed by hand in the Web UI means exactly what it says.
StrictBool = Annotated[bool, Strict()]


class Contract(BaseModel):
    """Base of every boundary model: JSON-friendly, strict about unknown fields."""

    model_config = ConfigDict(extra="forbid")


def input_problems(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line naming every bad field of a workflow input and its problem, e.g.
    `device: Field required; dryrun: unknown field (fields: device, alerts, ...)`."""
    problems = []
    for e in err.errors():
        where = ".".join(str(part) for part in e["loc"]) or "input"
        if e["type"] == "extra_forbidden":
            known = (
                f" (fields: {', '.join(f for f in model.model_fields if f != 'resume')})"
                if model and len(e["loc"]) == 1
                else ""
            )
            problems.append(f"{where}: unknown field{known}")
        elif e["type"] == "model_type" and not e["loc"]:
            problems.append(f"input: must be a JSON object, got {e.get('input')!r}")
        elif e["type"] in ("bool_type", "string_type", "int_type", "model_type", "dict_type"):
            problems.append(f"{where}: {e['msg']}, got {e.get('input')!r}")
        else:
            problems.append(f"{where}: {e['msg']}")
    return "; ".join(problems)


_ISO_DURATION = TypeAdapter(timedelta)

# --- what people send ---------------------------------------------------------------------
# Signals and updates typed by a person (Web UI "Send a Signal/Update", CLI) mean exactly what
# they say: no string-to-bool ("yes" is not true), string-to-number or number-to-time coercion.


def parse_person_duration(value: Any) -> Any:
    """A duration a person sends: a string with its unit (`30m`, `1h30m`, `90s`, `2d`, or ISO
    8601 `PT30M`). A bare number (`30`, `"30"`) is refused: 30 what? A person who meant
    minutes would get seconds (`Duration`, for files and flags, reads it as seconds)."""
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str):
        raise ValueError(
            f'a duration is a string with its unit, e.g. "30m", "1h30m", "90s"; got {value!r}'
        )
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        raise ValueError(f'a duration needs its unit, e.g. "{text}m" or "{text}s"; got {value!r}')
    parsed = parse_duration(text)
    if isinstance(parsed, timedelta):
        return parsed
    try:  # ISO 8601 (`PT30M`), as pydantic reads it
        return _ISO_DURATION.validate_python(text)
    except ValidationError:
        raise ValueError(
            f'not a duration: {value!r} (e.g. "30m", "1h30m", "90s", "PT30M")'
        ) from None


def parse_person_time(value: Any) -> Any:
    """A time a person sends: an ISO 8601 string (UTC when it has no offset). A number is
    refused: seconds or milliseconds since the epoch are not what anyone types for a time."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError(
            f'a time is an ISO 8601 string, e.g. "2030-01-01T16:00:00Z"; got {value!r}'
        )
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f'not an ISO 8601 time: {value!r} (e.g. "2030-01-01T16:00:00Z")') from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


PersonDuration = Annotated[
    timedelta,
    BeforeValidator(parse_person_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A duration in a person's signal or update: a string with its unit, never a bare number."""

PersonTime = Annotated[datetime, BeforeValidator(parse_person_time)]
"""A time in a person's signal or update: an ISO 8601 string, never a number."""


class PersonInput(Contract):
    """Base of every signal and update a person sends: strict (a JSON boolean for a bool, a
    string for a string: `{"approve": "yes"}` is refused naming the field, never taken as
    approval), unknown fields refused. Durations and times use `PersonDuration` /
    `PersonTime`, which read the strings people type."""

    model_config = ConfigDict(extra="forbid", strict=True)
