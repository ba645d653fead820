"""``python -m local_stack.moto_server -H HOST -p PORT``: moto's server exactly as
``python -m moto.server`` runs it, but with its Kinesis requests served one at a time.

Why: moto's Kinesis numbers a record by reading the shard's highest sequence number
and storing the next one, with nothing held in between (``Shard.put_record``, "not
safe for concurrency"), and its server runs each request in a thread of its own. Two
``PutRecords`` on one shard at once may then give two records the same number, and
the second overwrites the first: 12 writers of 20-record requests on one shard lost
421 of 30,000 records here. The fleet's sinks write from many threads and workers at
once, so a test of them on plain moto would count moto's losses as theirs. Every other
service is served as moto serves it (in parallel: an SQS long poll must not hold up
anything else).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

KINESIS_TARGET_PREFIX: Final = "Kinesis_"
"""``X-Amz-Target`` of every Kinesis call (JSON protocol: ``Kinesis_20131202.PutRecords``)."""

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class SerialKinesis:
    """WSGI middleware: Kinesis requests one at a time, the rest as they come."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if not str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith(KINESIS_TARGET_PREFIX):
            return self._app(environ, start_response)
        with self._lock:
            # The whole body inside the lock: a lazy one would run moto after release.
            return list(self._app(environ, start_response))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local_stack.moto_server")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args(argv)

    # Imported here: moto's server modules load every backend's URL table.
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    # moto reads its own port from here (pre-signed URLs, the moto API).
    os.environ.setdefault("MOTO_PORT", str(args.port))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # type: ignore[attr-defined]  # as moto.server sets it
    run_simple(
        args.host,
        args.port,
        SerialKinesis(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
