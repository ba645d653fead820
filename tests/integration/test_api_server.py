"""The local HTTP adapter: requests become HTTP API v2 events; the server's own
refusals are JSON 4xx like the API's, never HTML pages or 5xx."""

from __future__ import annotations

import json
import socket

import pytest

from local_stack.api_server import MAX_REQUEST_BYTES, http_event, serve_router
from tests.support.timing import scaled

pytestmark = pytest.mark.timeout(scaled(30))


def echo(event, context):
    return {
        "statusCode": 200,
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps(
            {
                "method": event["requestContext"]["http"]["method"],
                "path": event["rawPath"],
                "query": event.get("queryStringParameters"),
                "body": event.get("body"),
                "b64": event["isBase64Encoded"],
            }
        ),
    }


@pytest.fixture
def port():
    server, thread = serve_router("127.0.0.1", 0, echo)
    yield server.server_port
    server.shutdown()
    server.server_close()
    thread.join(scaled(5))


def raw(port: int, request: bytes) -> tuple[str, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(5)) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).decode(errors="replace").partition("\r\n\r\n")
    return head.splitlines()[0], body


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"FOO / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, "method_not_allowed"),
        (b"TRACE / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, "method_not_allowed"),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 400, "invalid_request"),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
        (b"garbage\r\n\r\n", 400, "invalid_request"),
        (
            b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\nConnection: close\r\n\r\n",
            400,
            "invalid_request",
        ),
        (
            b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (MAX_REQUEST_BYTES + 1),
            413,
            "body_too_large",
        ),
    ],
)
def test_server_refusals_are_json_4xx(port, request_bytes, status, code):
    status_line, body = raw(port, request_bytes)
    assert status_line.startswith(f"HTTP/1.1 {status} ")
    answer = json.loads(body)
    assert answer["error"] == code
    assert isinstance(answer["message"], str)


def test_chunked_body_reaches_the_handler(port):
    request = (
        b"POST /connections HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    status_line, body = raw(port, request)
    assert status_line.startswith("HTTP/1.1 200 ")
    assert json.loads(body)["body"] == "hello world"


def test_head_answers_without_a_body(port):
    status_line, body = raw(port, b"HEAD /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_line.startswith("HTTP/1.1 200 ")
    assert body == ""


def test_event_shape():
    event = http_event(
        "GET", "/connections?state=STARTED&a=1&a=2", {"Host": "h", "X-Y": "z"}, b"", "1.2.3.4"
    )
    assert event["version"] == "2.0"
    assert event["rawPath"] == "/connections"
    assert event["rawQueryString"] == "state=STARTED&a=1&a=2"
    assert event["queryStringParameters"] == {"state": "STARTED", "a": "1,2"}
    assert event["headers"] == {"host": "h", "x-y": "z"}
    assert event["requestContext"]["http"]["method"] == "GET"
    assert event["requestContext"]["http"]["sourceIp"] == "1.2.3.4"
    assert "body" not in event
    binary = http_event("POST", "/", {}, b"\xff\x00", "1.2.3.4")
    assert binary["isBase64Encoded"] is True
    assert binary["body"] == "/wA="
