"""websocket-fleet as a CDK construct library, for your own CDK app::

    from websocket_fleet import WebSocketFleet, WorkerHandler

    WebSocketFleet(
        stack,
        "Fleet",
        handler=WorkerHandler.from_directory("handler", factory="my_sink:factory"),
        allowed_upstream_hosts=["*.feeds.example.com"],
        worker_settings={"HANDLER_ERRORS": "skip"},
    )

README.md, "Your own handler", walks through it; docs/DEPLOY.md describes every option.
"""

from __future__ import annotations

from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.fleet import WebSocketFleet
from websocket_fleet.handler import WorkerHandler
from websocket_fleet.options import FleetOptions, ImportedVpc, ProvisionedCapacity
from wsfleet.version import VERSION

__version__ = VERSION
__all__ = [
    "FleetOptions",
    "FleetOptionsError",
    "ImportedVpc",
    "ProvisionedCapacity",
    "WebSocketFleet",
    "WorkerHandler",
    "__version__",
]
