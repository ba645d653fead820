"""The one error the construct raises for options it cannot deploy."""

from __future__ import annotations


class FleetOptionsError(ValueError):
    """An option that cannot be deployed; ``option`` names it (the keyword argument of
    :class:`websocket_fleet.WebSocketFleet`), the message says why."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.reason = message
