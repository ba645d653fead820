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

The names are imported when first used: ``fleetctl`` uses the parts that need no CDK
(the handler checks, the image context) without starting jsii's Node process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from wsfleet.version import VERSION

if TYPE_CHECKING:
    from websocket_fleet.errors import FleetOptionsError
    from websocket_fleet.fleet import WebSocketFleet
    from websocket_fleet.handler import WorkerHandler
    from websocket_fleet.options import FleetOptions, ImportedVpc, ProvisionedCapacity

__version__ = VERSION
_PUBLIC = {
    "FleetOptions": "websocket_fleet.options",
    "FleetOptionsError": "websocket_fleet.errors",
    "ImportedVpc": "websocket_fleet.options",
    "ProvisionedCapacity": "websocket_fleet.options",
    "WebSocketFleet": "websocket_fleet.fleet",
    "WorkerHandler": "websocket_fleet.handler",
}
__all__ = [
    "FleetOptions",
    "FleetOptionsError",
    "ImportedVpc",
    "ProvisionedCapacity",
    "WebSocketFleet",
    "WorkerHandler",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'websocket_fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
