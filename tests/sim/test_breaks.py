"""Every break of the recall still applies to today's code: each text it replaces is
there exactly as often as it says (a break whose text has moved would put nothing
back, and its recall row would mean nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.breaks import BREAKS, Break


@pytest.mark.parametrize("broken", BREAKS, ids=[b.name for b in BREAKS])
def test_the_break_applies(broken: Break) -> None:
    for file, text, _replacement, *count in broken.edits:
        wanted = count[0] if count else 1
        assert Path(file).read_text().count(text) == wanted, (broken.name, file, text)


def test_the_names_are_distinct() -> None:
    names = [b.name for b in BREAKS]
    assert len(names) == len(set(names))
