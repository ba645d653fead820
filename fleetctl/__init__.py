"""``fleetctl``: start, stop, inspect and watch fleet connections through the router's
HTTP API, on the local stack (default ``http://127.0.0.1:8080``) or a deployed API
(requests signed with SigV4). Run ``python -m fleetctl --help``."""
