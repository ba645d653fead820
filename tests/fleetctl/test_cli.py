"""The CLI end to end against the router served by the local adapter (DynamoDB Local,
moto SQS): output, ``--json``, exit codes."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl import cli
from fleetctl.cli import EXIT_API_ERROR, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, main
from fleetctl.client import FleetClient
from local_stack import services
from local_stack.clock import now_ms
from tests.support.fleet import wait_until
from tests.support.processes import children_take_sigint
from wsfleet.checkpoint_page import PageEntry
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = Path(__file__).resolve().parents[2]
FEED = "ws://127.0.0.1:8765/demo"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_start_get_list_stop(router_api: str) -> None:
    code, out, err = run("--api", router_api, "start", FEED, "--id", "demo-1")
    assert (code, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert lines[0] == "demo-1: created"
    assert "state          STARTED" in lines
    assert f"ws_url         {FEED}" in lines
    assert "session        -" in lines  # nobody owns it yet

    code, out, _ = run("--api", router_api, "start", FEED, "--id", "demo-1")
    assert (code, out.splitlines()[0]) == (EXIT_OK, "demo-1: already running (nothing changed)")

    code, out, _ = run("--api", router_api, "get", "demo-1")
    assert code == EXIT_OK
    assert out.splitlines()[0] == "connection     demo-1"
    assert "start_gen      1" in out.splitlines()
    assert "checkpoint     from the item" in out.splitlines()
    assert "status         pending" in out.splitlines()  # no worker runs here
    assert "messages/s     -" in out.splitlines()

    code, out, _ = run("--api", router_api, "list")
    assert code == EXIT_OK
    header, row = out.splitlines()
    assert header.split()[:4] == ["CONNECTION", "STATE", "STATUS", "OWNER"]
    assert row.split()[:4] == ["demo-1", "STARTED", "pending", "-"]

    code, out, _ = run("--api", router_api, "stop", "demo-1")
    assert code == EXIT_OK
    assert out == "demo-1: STOPPED (its owner closes it within one heartbeat)\n"
    assert run("--api", router_api, "list", "--state", "STARTED")[1] == "no connections\n"


def test_json_prints_the_api_answer(router_api: str) -> None:
    code, out, _ = run(
        "--api",
        router_api,
        "--json",
        "start",
        FEED,
        "--id",
        "j-1",
        "--metadata",
        '{"team": "x", "w": 0.5}',
    )
    assert code == EXIT_OK
    started = json.loads(out)
    assert (started["outcome"], started["metadata"]) == ("created", {"team": "x", "w": 0.5})
    code, out, _ = run("--api", router_api, "get", "j-1", "--json")  # after the command too
    assert json.loads(out) == FleetClient(router_api).get("j-1")
    listed = json.loads(run("--api", router_api, "list", "--json")[1])
    assert [v["connection_id"] for v in listed["connections"]] == ["j-1"]
    assert listed["next_token"] is None
    stopped = json.loads(run("--api", router_api, "stop", "j-1", "--json")[1])
    assert stopped["state"] == "STOPPED"


def test_the_client_starts_with_auth_and_a_protocol(router_api: str) -> None:
    client = FleetClient(router_api)
    auth = {"secret": "websocket-fleet/feeds/acme"}
    protocol = {
        "name": "json-field",
        "options": {
            "sequence": "/sequence",
            "resume": "subscribe",
            "subscribe": {"op": "subscribe", "token": "${secret:token}", "from": "${from_seq}"},
        },
    }
    started = client.start(FEED, connection_id="a-1", auth=auth, protocol=protocol)
    assert (started["outcome"], started["auth"], started["protocol"]) == (
        "created",
        auth,
        protocol,
    )
    again = client.start(FEED, connection_id="a-1", auth=auth, protocol=protocol)
    assert again["outcome"] == "already_started"


def test_start_takes_an_auth_secret_and_a_protocol_on_the_command_line(router_api: str) -> None:
    protocol = {"name": "live", "options": {"subscribe": {"op": "sub", "key": "${secret:key}"}}}
    code, out, _ = run(
        "--api",
        router_api,
        "--json",
        "start",
        FEED,
        "--id",
        "cli-auth",
        "--auth-secret",
        "websocket-fleet/feeds/acme",
        "--protocol",
        json.dumps(protocol),
    )
    assert code == EXIT_OK
    started = json.loads(out)
    assert (started["auth"], started["protocol"]) == (
        {"secret": "websocket-fleet/feeds/acme"},
        protocol,
    )
    code, _, err = run(
        "--api", router_api, "start", FEED, "--id", "cli-bad", "--auth-secret", "prod/db/root"
    )
    assert code == EXIT_API_ERROR
    assert "invalid_auth" in err


def test_a_generated_id(router_api: str) -> None:
    code, out, _ = run("--api", router_api, "--json", "start", FEED)
    assert code == EXIT_OK
    assert len(json.loads(out)["connection_id"]) == 32


def test_list_all_follows_next_token(router_api: str) -> None:
    client = FleetClient(router_api)
    for i in range(5):
        client.start(f"{FEED}/{i}", connection_id=f"page-{i}")
    code, out, _ = run("--api", router_api, "list", "--limit", "2")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert len(lines) == 4  # header, two rows, the hint
    assert lines[-1].startswith("more: --all, or --next-token ")
    token = lines[-1].split()[-1]
    code, out, _ = run("--api", router_api, "list", "--limit", "2", "--next-token", token)
    assert code == EXIT_OK
    code, out, _ = run("--api", router_api, "list", "--limit", "2", "--all")
    assert code == EXIT_OK
    assert sorted(line.split()[0] for line in out.splitlines()[1:]) == [
        f"page-{i}" for i in range(5)
    ]
    everything = json.loads(run("--api", router_api, "--json", "list", "--all", "--limit", "2")[1])
    assert len(everything["connections"]) == 5
    assert everything["next_token"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["get", "nobody"], "fleetctl: error: HTTP 404 not_found: no connection nobody"),
        (["stop", "nobody"], "fleetctl: error: HTTP 404 not_found: no connection nobody"),
        (
            ["get", "bad id"],
            "fleetctl: error: HTTP 400 invalid_connection_id: "
            "connection ids are 1-128 chars of [A-Za-z0-9._:-]",
        ),
        (
            ["start", "ws://evil.example.org/x"],
            "fleetctl: error: HTTP 400 host_not_allowed: host evil.example.org is not in the "
            "allow-list",
        ),
        (
            ["start", "ws://10.0.0.1/x"],
            "fleetctl: error: HTTP 400 address_not_allowed: ws_url points to a private, "
            "loopback, link-local or reserved address (10.0.0.1)",
        ),
        (["list", "--limit", "500"], "fleetctl: error: HTTP 400 validation_error: "),
    ],
)
def test_api_errors_exit_1_with_one_line(router_api: str, argv: list[str], message: str) -> None:
    code, out, err = run("--api", router_api, *argv)
    assert code == EXIT_API_ERROR
    assert out == ""
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_a_conflict_names_the_rule(router_api: str) -> None:
    run("--api", router_api, "start", FEED, "--id", "busy")
    code, _, err = run("--api", router_api, "start", FEED + "/other", "--id", "busy")
    assert code == EXIT_API_ERROR
    assert err == (
        "fleetctl: error: HTTP 409 conflict: connection busy is running with another ws_url; "
        "stop it first\n"
    )


def test_connection_refused_says_how_to_start_the_local_stack() -> None:
    api = f"http://127.0.0.1:{services.free_port()}"
    code, out, err = run("--api", api, "list")
    assert code == EXIT_UNREACHABLE
    assert out == ""
    assert err == (
        f"fleetctl: error: cannot reach {api} (connection refused); the local stack may not "
        "be running: start it with ./scripts/run-local.sh\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["start", FEED, "--metadata", "{not json"],
        ["start", FEED, "--metadata", "[1, 2]"],
        ["start", FEED, "--protocol", "json-field"],
        ["list", "--state", "RUNNING"],
        ["list", "--limit", "ten"],
        ["watch", "--interval", "0"],
        ["--timeout", "-1", "list"],
        ["frobnicate"],
        [],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_USAGE
    assert "usage: fleetctl" in capsys.readouterr().err


def test_fleet_api_url_is_the_default_target(
    router_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_API_URL", router_api)
    assert run("list")[0] == EXIT_OK
    monkeypatch.setenv("FLEET_API_URL", f"http://127.0.0.1:{services.free_port()}")
    assert run("list")[0] == EXIT_UNREACHABLE


def test_watch_prints_plain_frames_off_a_terminal(router_api: str) -> None:
    client = FleetClient(router_api)
    client.start(FEED, connection_id="w-1")
    client.start(FEED + "/2", connection_id="w-2")
    client.stop("w-2")
    code, out, _ = run("--api", router_api, "watch", "--interval", "0.05", "--count", "2")
    assert code == EXIT_OK
    assert "\x1b" not in out
    frames = ["fleet at " + f for f in out.split("fleet at ") if f]
    assert len(frames) == 2
    first = frames[0].splitlines()
    assert first[0].startswith(f"fleet at {router_api}  ")
    assert first[-1] == ""  # a blank line between frames
    assert first[1] == (
        "2 connections: 1 STARTED (1 pending), 1 STOPPED; owned by 0 workers; 0.0 msg/s"
    )
    assert [line.split()[0] for line in first[3:-1]] == ["CONNECTION", "w-1", "w-2"]
    # No worker runs here: nobody owns it, so there is no rate however many polls.
    assert frames[1].splitlines()[4].split()[2] == "pending"
    assert frames[1].splitlines()[4].split()[-1] == "-"


class ScriptedApi:
    """Answers ``list_all`` with one scripted fleet per poll (no network)."""

    api_url = "http://scripted"

    def __init__(self, polls: list[list[dict[str, Any]]]) -> None:
        self.polls = polls
        self.calls = 0

    def list_all(self, *, state: str | None = None) -> dict[str, Any]:
        views = self.polls[min(self.calls, len(self.polls) - 1)]
        self.calls += 1
        return {"connections": views, "next_token": None}


def api_view(
    seq: int, rate: float | None, status: str = "streaming", **health: Any
) -> dict[str, Any]:
    return {
        "connection_id": "demo-1",
        "state": "STARTED",
        "owner": "w-1",
        "owner_session_gen": 1,
        "owner_session_state": "ALIVE",
        "session_seconds_left": 1.5,
        "epoch": 1,
        "last_seq": seq,
        "checkpoint_at": "2026-01-01T00:00:05.000+00:00",
        "checkpoint_age_seconds": 0.5,
        "start_gen": 1,
        "status": status,
        "seconds_since_last_message": 0.2,
        "reconnects": 0,
        "last_error": None,
        "messages_per_second": rate,
    } | health


def test_watch_shows_the_views_own_rate_and_health() -> None:
    api = ScriptedApi(
        [
            [api_view(0, None, "connecting", seconds_since_last_message=None)],
            [api_view(25, 5.0)],
            [api_view(25, 5.0)],  # the same page polled again: the same number
            [api_view(40, 7.5)],
            [api_view(40, 0, "backing_off", reconnects=3, last_error="HTTP 503")],
            [
                api_view(
                    40,
                    None,
                    "pending",  # the owner's session ended: null health, as the API says
                    owner_session_state="DEAD",
                    session_seconds_left=0,
                    seconds_since_last_message=None,
                    reconnects=None,
                )
            ],
        ]
    )
    # Polls at irregular moments: the rate is the owner's, so they do not enter it.
    moments = iter([0.0, 0.1, 0.3, 4.0, 4.2, 11.0, 11.5, 11.6, 30.0, 30.1, 31.0, 31.2])
    out = io.StringIO()
    args = cli.build_parser().parse_args(["watch", "--count", "6"])
    code = cli.watch(api, args, out, monotonic=lambda: next(moments), sleep=lambda _: None)
    assert code == EXIT_OK
    frames = [f for f in out.getvalue().split("fleet at ") if f]
    rows = [frame.splitlines()[4] for frame in frames]
    assert [row.split()[2] for row in rows] == [
        "connecting",
        "streaming",
        "streaming",
        "streaming",
        "backing_off",
        "pending",
    ]
    assert [row.split()[-1] for row in rows[:4]] == ["-", "5.0", "5.0", "7.5"]
    assert rows[4].endswith("0.2s    0.0  HTTP 503 (x3)")
    assert rows[5].split()[-2:] == ["-", "-"]
    assert frames[1].splitlines()[1] == (
        "1 connection: 1 STARTED (1 streaming), 0 STOPPED; owned by 1 worker; 5.0 msg/s"
    )
    assert frames[4].splitlines()[1].startswith("1 connection: 1 STARTED (1 backing off),")


def test_get_list_and_watch_show_the_owners_session_and_page(
    router_api: str, ddb: Any, table: str
) -> None:
    client = FleetClient(router_api)
    client.start(FEED, connection_id="owned-1")
    client.start(FEED + "/2", connection_id="free-1")
    timing = LeaseTiming.from_lease(2.0)
    sessions = SessionStore(ddb, table, timing)
    now = now_ms()
    assert sessions.open("w-cli", 2, now + 60_000, capacity=4)  # time left: about a minute
    lease = LeaseStore(ddb, table, timing).acquire("owned-1", "w-cli", 2, now)
    assert isinstance(lease, Lease), lease
    entry = PageEntry(lease.epoch, lease.seq_gen, seq=321, advanced_at_ms=now - 500)
    assert sessions.write_page("w-cli", 2, {"owned-1": entry}, now, 1)

    code, out, _ = run("--api", router_api, "get", "owned-1")
    assert code == EXIT_OK
    details = dict(re.split(" {2,}", line, maxsplit=1) for line in out.splitlines())
    assert details["owner"] == "w-cli"
    assert re.fullmatch(r"#2 ALIVE, (5\d|6[0-2])\.\ds left", details["session"])
    assert details["last_seq"] == "321"
    assert re.fullmatch(r"owner's page of \S+ \(\d+\.\ds ago\)", details["checkpoint"])
    assert details["status"] == "streaming"
    assert re.fullmatch(r"\d+\.\ds ago", details["last message"])
    assert details["messages/s"] == "-"  # the page has no rate for it yet
    assert "reconnects" not in details

    code, out, _ = run("--api", router_api, "list")
    assert code == EXIT_OK
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["owned-1"][2:4] == ["streaming", "w-cli"]
    assert re.fullmatch(r"(5\d|6[0-2])\.\ds", rows["owned-1"][4])
    assert rows["owned-1"][6] == "321"
    assert re.fullmatch(r"\d+\.\ds", rows["owned-1"][7])  # the page's age
    assert re.fullmatch(r"\d+\.\ds", rows["owned-1"][8])  # since the last message
    assert rows["free-1"][2:5] == ["pending", "-", "-"]

    code, out, _ = run("--api", router_api, "watch", "--count", "1")
    assert code == EXIT_OK
    assert "2 STARTED (1 streaming, 1 pending)" in out
    watched = {line.split()[0]: line.split() for line in out.splitlines()[4:] if line}
    assert watched["owned-1"][6] == "321"
    assert watched["owned-1"][-1] == "-"  # the page has no rate for it yet


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watch_redraws_in_place_on_a_terminal_and_ctrl_c_exits_0(router_api: str) -> None:
    FleetClient(router_api).start(FEED, connection_id="t-1")
    out = Terminal()
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 3:
            raise KeyboardInterrupt

    args = cli.build_parser().parse_args(["--api", router_api, "watch", "--interval", "0.5"])
    code = cli.watch(FleetClient(router_api), args, out, sleep=sleep)
    assert code == EXIT_OK
    text = out.getvalue()
    assert text.count("\x1b[H\x1b[J") == 3
    assert "t-1" in text.split("\x1b[H\x1b[J")[-1]
    assert all(0 <= s <= 0.5 for s in polls)


def test_watch_fails_fast_when_the_first_poll_fails() -> None:
    api = f"http://127.0.0.1:{services.free_port()}"
    code, out, err = run("--api", api, "watch", "--count", "3")
    assert (code, out) == (EXIT_UNREACHABLE, "")
    assert "./scripts/run-local.sh" in err


def subprocess_env(api: str) -> dict[str, Any]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FLEET_API_URL": api}


def test_python_m_fleetctl(router_api: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetctl", "--json", "start", FEED, "--id", "sub-1"],
        env=subprocess_env(router_api),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout)["connection_id"] == "sub-1"


def test_ctrl_c_ends_watch_with_status_0(router_api: str, tmp_path: Path) -> None:
    FleetClient(router_api).start(FEED, connection_id="sigint")
    output = tmp_path / "watch.out"
    with output.open("w") as sink, children_take_sigint():
        process = subprocess.Popen(
            [sys.executable, "-m", "fleetctl", "watch", "--interval", "0.2"],
            env=subprocess_env(router_api),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "sigint" in output.read_text(), 30, "the first frame")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == EXIT_OK, output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=15)
    assert "Traceback" not in output.read_text()


def test_version_prints_the_projects_version(capsys: pytest.CaptureFixture[str]) -> None:
    from wsfleet.version import VERSION

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"fleetctl (websocket-fleet) {VERSION}"


def test_the_cli_starts_no_cdk() -> None:
    """fleetctl (check-handler included) imports the parts of websocket_fleet that need
    no CDK: jsii's Node process would cost seconds per command."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, fleetctl.cli, fleetctl.check_handler; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aws_cdk', 'jsii')))",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
