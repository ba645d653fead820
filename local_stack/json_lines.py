"""Reading JSON lines that other processes are still appending (worker logs, delivery
records)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonLinesTail:
    """Reads JSON lines appended to files since the last call; a line still being
    written (no newline yet) waits for the next call."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}

    def read(self, path: Path) -> list[dict[str, Any]]:
        """New complete JSON object lines of ``path`` (other lines are skipped)."""
        offset = self._offsets.get(path, 0)
        try:
            with path.open("rb") as stream:
                stream.seek(offset)
                chunk = stream.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self._offsets[path] = offset + end + 1
        found: list[dict[str, Any]] = []
        for line in chunk[: end + 1].splitlines():
            if not line.startswith(b"{"):
                continue
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
        return found
