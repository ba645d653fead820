"""A stub HTTP server that records what it receives and answers canned JSON, for the
signing tests; the real router for the end-to-end ones."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

VIEW = {
    "connection_id": "stubbed",
    "state": "STARTED",
    "ws_url": "wss://feeds.example.com/stubbed",
    "owner": None,
    "owner_session_gen": None,
    "owner_session_state": None,
    "session_seconds_left": None,
    "epoch": 0,
    "last_seq": 0,
    "checkpoint_at": None,
    "checkpoint_age_seconds": None,
    "last_advanced_at": None,
    "start_gen": 1,
    "created_at": None,
    "updated_at": None,
    "expires_at": None,
    "metadata": None,
}


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class StubApi:
    url: str
    received: list[Received] = field(default_factory=list)
    status: int = 200
    answer: Any = field(default_factory=lambda: dict(VIEW))


@pytest.fixture
def stub_api() -> Iterator[StubApi]:
    stub = StubApi(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            stub.received.append(
                Received(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
            )
            payload = json.dumps(stub.answer).encode()
            self.send_response(stub.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Static credentials from the environment only (no profile or file of the machine)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


@pytest.fixture
def router_api(router_api: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The shared router fixture, with no FLEET_API_URL of the caller's leaking in."""
    monkeypatch.delenv("FLEET_API_URL", raising=False)
    return router_api
