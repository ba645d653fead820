"""The router's HTTP API as Python calls, over the standard library's HTTP client, with
SigV4 signing (botocore's signer) for a deployed API behind IAM auth."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import quote, urlencode, urlsplit

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials

API_URL_ENV: Final = "FLEET_API_URL"
DEFAULT_API_URL: Final = "http://127.0.0.1:8080"
SERVICE_NAME: Final = "execute-api"
USER_AGENT: Final = "fleetctl/0.1"
LOCAL_STACK_HINT: Final = "the local stack may not be running: start it with ./scripts/run-local.sh"
_EXECUTE_API_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com$")


class ClientError(Exception):
    """Anything that keeps a command from getting its answer; ``str()`` is one line."""


class ApiError(ClientError):
    """The API answered with an error status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class UnreachableError(ClientError):
    """No answer at all: refused, timed out, unknown host."""


class ConfigError(ClientError):
    """Signing is needed but credentials or region are missing."""


class Signer(Protocol):
    def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        """The headers to send: ``headers`` plus the authentication ones."""
        ...


@dataclass(frozen=True)
class SigV4Signer:
    """Signs requests for API Gateway's IAM authorization (service ``execute-api``)."""

    credentials: Credentials | ReadOnlyCredentials
    region: str
    service: str = SERVICE_NAME

    def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        request = AWSRequest(method=method, url=url, headers=dict(headers), data=body or b"")
        SigV4Auth(self.credentials, self.service, self.region).add_auth(request)
        return {name: str(value) for name, value in request.headers.items()}


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def needs_signing(api_url: str) -> bool:
    """A deployed API: https on a host that is not this machine."""
    parts = urlsplit(api_url)
    return parts.scheme == "https" and not is_loopback(parts.hostname or "")


def region_from_url(api_url: str) -> str | None:
    """``us-east-1`` from ``https://abc123.execute-api.us-east-1.amazonaws.com``."""
    match = _EXECUTE_API_HOST.search(urlsplit(api_url).hostname or "")
    return match.group(1) if match else None


def signer_from_session(api_url: str, *, profile: str | None, region: str | None) -> SigV4Signer:
    """Credentials and region the usual AWS ways (environment, profile, SSO, instance
    role); the region may also come from the API's host name."""
    try:
        session = boto3.Session(profile_name=profile, region_name=region)
        credentials = session.get_credentials()
    except Exception as error:  # botocore raises many kinds for a broken profile
        raise ConfigError(f"cannot load AWS credentials: {error}") from None
    if credentials is None:
        raise ConfigError(
            "no AWS credentials found: set AWS_PROFILE (or --profile) or AWS_ACCESS_KEY_ID"
        )
    # AWS_REGION is what the AWS CLI v2 and the SDKs of other languages read.
    chosen = (
        region or session.region_name or os.environ.get("AWS_REGION") or region_from_url(api_url)
    )
    if not chosen:
        raise ConfigError("no AWS region: pass --region or set AWS_REGION")
    return SigV4Signer(credentials.get_frozen_credentials(), chosen)


class FleetClient:
    """One method per route of the router's HTTP API; each returns the decoded JSON."""

    def __init__(
        self, api_url: str, *, signer: Signer | None = None, timeout: float = 10.0
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self._signer = signer
        self._timeout = timeout
        parts = urlsplit(self.api_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"not an http(s) URL: {api_url!r}")
        # Proxies from the environment are for the internet, not for this machine.
        proxies: dict[str, str] | None = {} if is_loopback(parts.hostname) else None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))

    def start(
        self,
        ws_url: str,
        *,
        connection_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        auth: Mapping[str, Any] | None = None,
        protocol: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``POST /connections``. ``auth`` is the credentials reference
        (``{"secret": "<name or ARN>"}``), ``protocol`` the spec
        (``{"name": ..., "options": {...}}``); both are sent as given."""
        body: dict[str, Any] = {"ws_url": ws_url}
        if connection_id is not None:
            body["connection_id"] = connection_id
        if metadata is not None:
            body["metadata"] = dict(metadata)
        if auth is not None:
            body["auth"] = dict(auth)
        if protocol is not None:
            body["protocol"] = dict(protocol)
        return self._call("POST", "/connections", body=body)

    def stop(self, connection_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/connections/{quote(connection_id, safe='')}")

    def get(self, connection_id: str) -> dict[str, Any]:
        return self._call("GET", f"/connections/{quote(connection_id, safe='')}")

    def list_page(
        self, *, state: str | None = None, limit: int | None = None, next_token: str | None = None
    ) -> dict[str, Any]:
        query = {"state": state, "limit": limit, "next_token": next_token}
        return self._call(
            "GET", "/connections", query={k: str(v) for k, v in query.items() if v is not None}
        )

    def list_all(
        self, *, state: str | None = None, page_size: int = 100, max_pages: int = 10_000
    ) -> dict[str, Any]:
        """Every page, following ``next_token``; the same shape as one page."""
        connections: list[Any] = []
        token: str | None = None
        for _ in range(max_pages):
            page = self.list_page(state=state, limit=page_size, next_token=token)
            connections.extend(page.get("connections", []))
            token = page.get("next_token")
            if not token:
                break
        return {"connections": connections, "next_token": token}

    # --- plumbing ----------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        url = self.api_url + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._signer is not None:
            headers = self._signer.sign(method, url, headers, data)
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise _api_error(error.code, error.read(), error.reason) from None
        except (urllib.error.URLError, OSError) as error:
            raise self._unreachable(error) from None
        try:
            decoded = json.loads(raw)
        except ValueError:
            raise ApiError(200, "invalid_response", "the answer is not JSON") from None
        if not isinstance(decoded, dict):
            raise ApiError(200, "invalid_response", "the answer is not a JSON object")
        return decoded

    def _unreachable(self, error: Exception) -> UnreachableError:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        if isinstance(reason, ConnectionRefusedError):
            what = "connection refused"
        elif isinstance(reason, TimeoutError):
            what = f"no answer within {self._timeout:g} s"
        else:
            what = str(reason) or type(reason).__name__
        message = f"cannot reach {self.api_url} ({what})"
        if is_loopback(urlsplit(self.api_url).hostname or ""):
            message += f"; {LOCAL_STACK_HINT}"
        return UnreachableError(message)


def _api_error(status: int, raw: bytes, reason: str) -> ApiError:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return ApiError(status, body["error"], str(body.get("message", "")))
    if isinstance(body, dict) and isinstance(body.get("message"), str):  # API Gateway's own
        return ApiError(status, "gateway_error", body["message"])
    text = raw.decode(errors="replace").strip().splitlines()
    return ApiError(status, "http_error", (text[0][:200] if text else "") or str(reason))
