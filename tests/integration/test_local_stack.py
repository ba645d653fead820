"""``python -m local_stack`` end to end: it starts DynamoDB Local, moto, the feed and real
workers on free ports, runs the demo connections, and on the way out leaves no lease
held and nothing running."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from local_stack.services import accepts_tcp
from tests.support.processes import run_module
from tests.support.timing import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]
ENDPOINTS = re.compile(
    r"^endpoints: dynamodb=http://127\.0\.0\.1:(\d+) sqs=http://127\.0\.0\.1:(\d+) "
    r"cloudwatch=\S+ feed=ws://127\.0\.0\.1:(\d+) api=http://127\.0\.0\.1:(\d+)$",
    re.MULTILINE,
)
DEMO_SEQ = re.compile(r"\b(demo-\d+) seq=(\d+)")


def run_local_stack(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return run_module("local_stack", args, timeout)


def processes_mentioning(text: str) -> list[str]:
    """Pids of live processes whose command line or environment contains ``text``
    (Linux /proc; the workers carry the state directory in HEALTH_FILE)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if text.encode() in blob:
            found.append(entry.name)
    return found


def logged_events(log: Path) -> list[dict[str, object]]:
    """The JSON log lines of a worker log (EMF metric lines included, harmlessly)."""
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


@pytest.mark.fleet
@pytest.mark.timeout(scaled(180))
def test_demo_runs_and_shuts_down_cleanly(tmp_path):
    state_dir = tmp_path / "state"
    result = run_local_stack(
        [
            "--base-port",
            "0",
            "--workers",
            "2",
            "--connections",
            "3",
            "--duration",
            "12",
            "--no-view",
            "--lease-seconds",
            "4",
            "--state-dir",
            str(state_dir),
        ],
        timeout=scaled(150),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output

    endpoints = ENDPOINTS.search(result.stdout)
    assert endpoints is not None, output
    ports = [int(port) for port in endpoints.groups()]

    # Final checkpoints, read from the table after the workers released their leases.
    final = next(
        (line for line in result.stdout.splitlines() if line.startswith("after shutdown:")), None
    )
    assert final is not None, output
    seqs = {cid: int(seq) for cid, seq in DEMO_SEQ.findall(final)}
    assert set(seqs) == {"demo-1", "demo-2", "demo-3"}, final
    assert all(seq > 0 for seq in seqs.values()), final
    assert re.search(r"^leases still held: 0$", result.stdout, re.MULTILINE), output
    # Summary lines were printed while running (one every 5 s without a live view).
    assert re.search(r"^\[\d+s\] workers 2/2 alive \| 3 connections", result.stdout, re.M), output

    # The workers did the work: every demo connection was acquired and handled, and each
    # worker shut down through its graceful path.
    logs = sorted((state_dir / "logs").glob("worker-*.log"))
    assert [log.name for log in logs] == ["worker-1.log", "worker-2.log"]
    acquired: set[object] = set()
    for log in logs:
        events = logged_events(log)
        acquired |= {e.get("connection_id") for e in events if e.get("message") == "lease acquired"}
        assert any(e.get("message") == "worker stopped" for e in events), log.read_text()
    assert acquired == {"demo-1", "demo-2", "demo-3"}
    # The demo connections were started through the router's HTTP API.
    router_logs = list((state_dir / "logs").glob("router-*.log"))
    assert len(router_logs) == 1
    assert router_logs[0].read_text().count("POST /connections") == 3

    # Nothing is left running: the servers' ports are closed, and no process carries
    # the state directory (the workers have it in HEALTH_FILE).
    assert [port for port in ports if accepts_tcp(port)] == []
    if Path("/proc/self/environ").exists():
        assert processes_mentioning(str(state_dir)) == []


def test_busy_port_fails_fast_naming_the_port_and_the_option(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_local_stack(
            ["--base-port", str(port), "--state-dir", str(tmp_path / "state")], timeout=scaled(60)
        )
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr
    assert "--base-port" in result.stderr
    # Failing fast: nothing was started, not even a log directory.
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--workers", "-1"],
        ["--rate", "nan"],
        ["--lease-seconds", "0"],
        ["--duration", "0"],
        ["--base-port", "65534"],
    ],
)
def test_bad_options_are_refused(args, tmp_path):
    result = run_local_stack([*args, "--state-dir", str(tmp_path / "state")], timeout=scaled(60))
    assert result.returncode == 2
    assert "error: argument" in result.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.fleet
@pytest.mark.timeout(scaled(120))
def test_a_closed_terminal_stops_the_stack_in_order(tmp_path):
    """SIGHUP (the terminal went away) must not orphan the servers and workers, which
    run in their own sessions: it is an orderly stop like Ctrl-C."""
    state_dir = tmp_path / "state"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "local_stack",
            "--base-port",
            "0",
            "--workers",
            "1",
            "--connections",
            "1",
            "--no-view",
            "--state-dir",
            str(state_dir),
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:  # ends at EOF; the pytest timeout bounds a hang
            seen.append(line)
            if line.startswith("endpoints:"):
                break
        endpoints = ENDPOINTS.search("".join(seen))
        assert endpoints is not None, "".join(seen)
        process.send_signal(signal.SIGHUP)
        rest, _ = process.communicate(timeout=scaled(60))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    output = "".join(seen) + rest
    assert process.returncode == 0, output
    assert re.search(r"^leases still held: 0$", output, re.MULTILINE), output
    ports = [int(port) for port in endpoints.groups()]
    assert [port for port in ports if accepts_tcp(port)] == []
    assert processes_mentioning(str(state_dir)) == []
