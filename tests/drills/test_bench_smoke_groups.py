"""The three bench smoke tests together run every benchmark section, each once."""

from __future__ import annotations

from bench.__main__ import ALL
from tests.drills.bench_quick import GROUPS


def test_every_section_is_in_exactly_one_smoke_group() -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(ALL)
    assert len(grouped) == len(set(grouped))
