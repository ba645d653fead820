"""``./scripts/run-local.sh --containers``: the local stack's workers run from the image
(built with the handler directory), not from the repository's code."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.timing import scaled

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(scaled(400))]

ROOT = Path(__file__).resolve().parents[2]
RECORDER = """\
import json
import os
import sys


class Recorder:
    async def handle(self, delivery):
        # The health stamp's folder is the one the local stack shares with the container.
        folder = os.path.dirname(os.environ["HEALTH_FILE"])
        with open(os.path.join(folder, "records.jsonl"), "a") as out:
            out.write(json.dumps({
                "connection_id": delivery.connection_id, "seq": delivery.seq,
                "executable": sys.executable, "uid": os.getuid(), "tag": os.environ["TAG"],
            }) + "\\n")


def factory():
    return Recorder()
"""


def test_run_local_with_containers_runs_the_workers_from_the_image(
    image_tools: None, tmp_path: Path
) -> None:
    handler = tmp_path / "handler"
    (handler / "recorder").mkdir(parents=True)
    (handler / "recorder" / "__init__.py").write_text(RECORDER)
    state = tmp_path / "state"
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "run-local.sh"),
            "--containers",
            "--container-env",
            "TAG",
            "--workers",
            "1",
            "--connections",
            "1",
            "--duration",
            "6",
            "--no-view",
            "--base-port",
            "0",
            "--state-dir",
            str(state),
            "--handler-dir",
            str(handler),
            "--handler",
            "recorder:factory",
        ],
        env={**os.environ, "TAG": "passed-in"},
        capture_output=True,
        text=True,
        timeout=scaled(300),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exit status: local-worker-1=0" in done.stdout + done.stderr
    records = [
        json.loads(line) for line in (state / "health" / "records.jsonl").read_text().splitlines()
    ]
    assert records
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    # The image's interpreter and user, not this checkout's virtualenv.
    assert {r["executable"] for r in records} == {"/usr/bin/python"}
    assert {r["uid"] for r in records} == {10001}
    assert {r["tag"] for r in records} == {"passed-in"}
