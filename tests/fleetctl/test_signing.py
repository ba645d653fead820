"""SigV4 signing with botocore's signer, checked on the wire against a stub server."""

from __future__ import annotations

import hashlib
import io
import json
import re

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from fleetctl.cli import EXIT_OK, EXIT_USAGE, main
from fleetctl.client import (
    ConfigError,
    FleetClient,
    SigV4Signer,
    needs_signing,
    region_from_url,
    signer_from_session,
)
from tests.fleetctl.conftest import StubApi

AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/"
    r"execute-api/aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})"
)


def signed_client(stub: StubApi, token: str | None = None) -> FleetClient:
    credentials = Credentials("AKIDEXAMPLE", "secret", token)
    return FleetClient(stub.url, signer=SigV4Signer(credentials, "eu-west-1"))


def test_a_signed_request_carries_sigv4_headers(stub_api: StubApi) -> None:
    signed_client(stub_api).start("wss://feeds.example.com/x", connection_id="c-1")

    (received,) = stub_api.received
    match = AUTH.fullmatch(received.headers["authorization"])
    assert match, received.headers["authorization"]
    assert match["key"] == "AKIDEXAMPLE"
    assert match["region"] == "eu-west-1"
    assert re.fullmatch(r"\d{8}T\d{6}Z", received.headers["x-amz-date"])
    assert received.headers["x-amz-date"].startswith(match["date"])
    assert {"host", "x-amz-date", "content-type"} <= set(match["signed"].split(";"))
    assert "x-amz-security-token" not in received.headers
    assert json.loads(received.body) == {
        "ws_url": "wss://feeds.example.com/x",
        "connection_id": "c-1",
    }


def test_the_signature_is_the_one_botocore_computes_for_what_was_sent(stub_api: StubApi) -> None:
    signed_client(stub_api).get("c-1")
    (received,) = stub_api.received
    match = AUTH.fullmatch(received.headers["authorization"])
    assert match
    # Re-sign the request as the server saw it, at the same instant.
    signed = match["signed"].split(";")
    replay = AWSRequest(
        method=received.method,
        url=stub_api.url + received.path,
        headers={name: received.headers[name] for name in signed if name != "host"},
        data=received.body,
    )
    auth = SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "execute-api", "eu-west-1")
    replay.context["timestamp"] = received.headers["x-amz-date"]
    canonical = auth.canonical_request(replay)
    string_to_sign = auth.string_to_sign(replay, canonical)
    assert auth.signature(string_to_sign, replay) == match["signature"]
    assert hashlib.sha256(received.body).hexdigest() in canonical


def test_temporary_credentials_send_their_session_token(stub_api: StubApi) -> None:
    signed_client(stub_api, token="session-token").list_page(state="STARTED")
    (received,) = stub_api.received
    assert received.headers["x-amz-security-token"] == "session-token"
    match = AUTH.fullmatch(received.headers["authorization"])
    assert match
    assert "x-amz-security-token" in match["signed"].split(";")


def test_unsigned_by_default_for_the_local_stack(stub_api: StubApi) -> None:
    FleetClient(stub_api.url).get("c-1")
    (received,) = stub_api.received
    assert "authorization" not in received.headers
    assert received.path == "/connections/c-1"


@pytest.mark.parametrize(
    ("url", "signed"),
    [
        ("http://127.0.0.1:8080", False),
        ("http://localhost:8080", False),
        ("https://127.0.0.1:8443", False),
        ("https://localhost", False),
        ("https://[::1]:8443", False),
        ("https://abc123.execute-api.us-east-1.amazonaws.com", True),
        ("https://fleet.example.com/prod", True),
        ("http://fleet.example.com", False),  # no IAM auth over plain http
    ],
)
def test_which_urls_are_signed(url: str, signed: bool) -> None:
    assert needs_signing(url) is signed


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://abc123.execute-api.us-east-1.amazonaws.com", "us-east-1"),
        ("https://abc123.execute-api.eu-central-2.amazonaws.com/prod/", "eu-central-2"),
        ("https://fleet.example.com", None),
        ("http://127.0.0.1:8080", None),
    ],
)
def test_region_from_the_api_host(url: str, region: str | None) -> None:
    assert region_from_url(url) == region


@pytest.mark.usefixtures("aws_env")
def test_credentials_and_region_come_from_the_usual_places(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = "https://abc123.execute-api.ap-south-1.amazonaws.com"
    signer = signer_from_session(api, profile=None, region=None)
    assert signer.credentials.access_key == "AKIDEXAMPLE"
    assert signer.region == "ap-south-1"  # from the host
    monkeypatch.setenv("AWS_REGION", "sa-east-1")
    assert signer_from_session(api, profile=None, region=None).region == "sa-east-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ca-central-1")  # boto3's own, read first
    assert signer_from_session(api, profile=None, region=None).region == "ca-central-1"
    assert signer_from_session(api, profile=None, region="us-west-2").region == "us-west-2"


@pytest.mark.usefixtures("aws_env")
def test_missing_credentials_region_or_profile_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="no AWS region"):
        signer_from_session("https://fleet.example.com", profile=None, region=None)
    with pytest.raises(ConfigError, match="cannot load AWS credentials"):
        signer_from_session("https://fleet.example.com", profile="nope", region="us-east-1")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError, match="no AWS credentials"):
        signer_from_session("https://fleet.example.com", profile=None, region="us-east-1")


@pytest.mark.usefixtures("aws_env")
def test_the_cli_signs_with_sign_always(stub_api: StubApi) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(
        ["--api", stub_api.url, "--sign", "always", "--region", "us-east-2", "get", "stubbed"],
        stdout=out,
        stderr=err,
    )
    assert code == EXIT_OK, err.getvalue()
    (received,) = stub_api.received
    match = AUTH.fullmatch(received.headers["authorization"])
    assert match
    assert (match["key"], match["region"]) == ("AKIDEXAMPLE", "us-east-2")
    assert "x-amz-date" in received.headers


@pytest.mark.usefixtures("aws_env")
def test_the_cli_explains_missing_signing_settings(stub_api: StubApi) -> None:
    err = io.StringIO()
    code = main(["--api", stub_api.url, "--sign", "always", "get", "x"], stderr=err)
    assert code == EXIT_USAGE
    assert err.getvalue().strip() == (
        "fleetctl: error: no AWS region: pass --region or set AWS_REGION"
    )
    assert stub_api.received == []
