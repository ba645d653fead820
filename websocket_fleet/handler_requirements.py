"""A handler directory's ``requirements.txt`` next to the worker's pins.

The image installs both in one pip run (worker/Dockerfile), so pip's resolver has the
last word, transitive conflicts included. What can be told without it is told at
synth: a requirement of the handler on a package the worker pins, which that pin does
not satisfy, fails at once with both lines named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from packaging.requirements import InvalidRequirement, Requirement

from websocket_fleet.sources import canonical_name, worker_pins

REQUIREMENTS_FILE: Final = "requirements.txt"


@dataclass(frozen=True, slots=True)
class RequirementConflict:
    handler_line: str
    where: str
    """``<file>:<line number>``."""
    worker_pin: str

    def __str__(self) -> str:
        return (
            f"the handler's requirement {self.handler_line!r} ({self.where}) conflicts with "
            f"the worker's pin {self.worker_pin!r} (worker/requirements.txt): the worker "
            "runs with exactly its pins; widen or drop the handler's requirement"
        )


def requirement_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, requirement)`` of a requirements file: comments, blank lines and
    pip options (``-r``, ``--index-url``, ...) left out, those are pip's to judge."""
    lines = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            lines.append((number, line))
    return lines


def conflicts(path: Path) -> list[RequirementConflict]:
    """The handler's requirements (``path``) that the worker's pins do not satisfy."""
    pins = worker_pins()
    found = []
    for number, line in requirement_lines(path):
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue  # pip reports it, with its own words, when the image is built
        pin = pins.get(canonical_name(requirement.name))
        if pin is None or requirement.url:
            continue
        pinned = pin.rpartition("==")[2]
        if not requirement.specifier.contains(pinned, prereleases=True):
            found.append(RequirementConflict(line, f"{path}:{number}", pin))
    return found
