"""Serve the router's Lambda handler over plain HTTP on loopback, the way API Gateway
would call it: each request becomes an HTTP API payload v2 event, and the handler's
answer becomes the HTTP response. The very same handler runs in AWS, with the same
settings from the environment (``lambdas/router/settings.py``): ``TABLE_NAME``,
``QUEUE_URL``, ``ALLOWED_UPSTREAM_HOSTS``, ``ALLOW_INSECURE_WS``,
``ALLOWED_SECRET_PREFIX``, and ``UPSTREAM_PROTOCOLS``, the plug-in protocols the
workers register, whose names a start may then give."""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
"""Larger requests are refused here, before the handler (API Gateway's own limit is
10 MB; the router refuses bodies over 16 KB itself)."""

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass
class LocalContext:
    """The parts of a Lambda context the router and Powertools read."""

    function_name: str = "websocket-fleet-router-local"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = (
        "arn:aws:lambda:us-east-1:000000000000:function:websocket-fleet-router-local"
    )
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def http_event(
    method: str, target: str, headers: dict[str, str], body: bytes, source_ip: str
) -> dict[str, Any]:
    """An HTTP API payload v2 event for one request (``target`` is path + query)."""
    parts = urlsplit(target)
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        # API Gateway joins repeated parameters with commas.
        query[key] = f"{query[key]},{value}" if key in query else value
    lowered = {k.lower(): v for k, v in headers.items()}
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": parts.path or "/",
        "rawQueryString": parts.query,
        "headers": lowered,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": lowered.get("host", "127.0.0.1"),
            "domainPrefix": "local",
            "http": {
                "method": method,
                "path": parts.path or "/",
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": "",
            "timeEpoch": 0,
        },
        "isBase64Encoded": False,
    }
    if query:
        event["queryStringParameters"] = query
    if body:
        try:
            event["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            event["body"] = base64.b64encode(body).decode()
            event["isBase64Encoded"] = True
    return event


_SERVER_ERRORS = {
    501: (405, "method_not_allowed"),
    505: (400, "invalid_request"),
    414: (414, "uri_too_long"),
    431: (431, "headers_too_large"),
}


class _RouterHTTPServer(ThreadingHTTPServer):
    # A burst of clients must queue, not be reset (the default backlog is 5).
    request_queue_size = 128
    daemon_threads = True


def _make_request_handler(handler: LambdaHandler) -> type[BaseHTTPRequestHandler]:
    class RequestHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "websocket-fleet-local-api"

        def _read_body(self) -> bytes | None:
            """The request body (Content-Length or chunked); None after answering an
            error for a body that cannot be read or is too large."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return self._read_chunked()
            length_header = self.headers.get("Content-Length", "0") or "0"
            try:
                length = int(length_header)
            except ValueError:
                self._reply(400, {"error": "invalid_request", "message": "bad Content-Length"})
                return None
            if length < 0 or length > MAX_REQUEST_BYTES:
                self._reply(413, {"error": "body_too_large", "message": "request too large"})
                return None
            return self.rfile.read(length) if length else b""

        def _read_chunked(self) -> bytes | None:
            body = bytearray()
            while True:
                size_line = self.rfile.readline(1024).split(b";", 1)[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    self._reply(400, {"error": "invalid_request", "message": "bad chunk size"})
                    return None
                if size < 0 or len(body) + size > MAX_REQUEST_BYTES:
                    self._reply(413, {"error": "body_too_large", "message": "request too large"})
                    return None
                if size == 0:
                    while self.rfile.readline(1024).strip():  # trailers
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline(1024)  # the CRLF after each chunk

        def _serve(self) -> None:
            body = self._read_body()
            if body is None:
                return
            event = http_event(
                self.command, self.path, dict(self.headers.items()), body, self.client_address[0]
            )
            try:
                result = handler(event, LocalContext())
            except Exception:
                log.exception("router handler failed")
                self._reply(500, {"error": "internal_error", "message": "internal error"})
                return
            raw = result.get("body") or ""
            payload = base64.b64decode(raw) if result.get("isBase64Encoded") else raw.encode()
            self.send_response(int(result.get("statusCode", 200)))
            headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
            headers.setdefault("content-type", "application/json")
            for name, value in headers.items():
                if name not in ("content-length", "connection"):
                    self.send_header(name, str(value))
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """http.server's own refusals (unknown method, bad request line, URI too
            long) as the API's JSON errors, never an HTML page or a 5xx."""
            # A request line that failed to parse leaves HTTP/0.9 behind, which would
            # send the body without a status line.
            self.request_version = "HTTP/1.1"
            status, error = _SERVER_ERRORS.get(
                code, (code if code < 500 else 400, "invalid_request")
            )
            self._reply(status, {"error": error, "message": message or "invalid request"})

        def _reply(self, status: int, body: dict[str, str]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            self.close_connection = True

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = do_OPTIONS = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), format % args)

    return RequestHandler


def serve_router(
    host: str, port: int, handler: LambdaHandler | None = None
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start serving in a daemon thread; stop with ``server.shutdown()``."""
    if handler is None:
        from lambdas.router.main import handler as router_handler

        handler = router_handler
    server = _RouterHTTPServer((host, port), _make_request_handler(handler))
    thread = threading.Thread(target=server.serve_forever, name="local-api", daemon=True)
    thread.start()
    return server, thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    server, thread = serve_router(args.host, args.port)
    print(f"router listening on http://{args.host}:{server.server_port}", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
