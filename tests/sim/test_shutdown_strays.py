"""P1: a connection owned by a worker's session and run by nobody (an acquire that
landed with its answer lost) is freed or taken over within the own-check bound,
shutdown or not. At a SIGTERM the session was retired only once the start queue's long
poll in flight had returned (up to ``SQS_WAIT_SECONDS`` + 5 s), and until the retire
nobody else could take the connection over."""

from __future__ import annotations

import json

from sim.dynamodb import SimDynamoDBClient
from sim.fleet import TABLE, Fleet, Shape
from sim.scenario import START
from tests.support.sim_script import run_script
from wsfleet import lease_rules
from wsfleet.desired_state import DesiredStateStore
from wsfleet.item_io import update_connection

SHAPE = Shape(
    workers=2, connections=1, rate=4.0, max_connections=20, duration=60.0, faults=0, batch=False
)


def test_a_stray_of_a_worker_sigtermed_runs_again_within_the_bound() -> None:
    def script(fleet: Fleet) -> None:
        # The first worker runs nothing: at its SIGTERM no hint of its own wakes its poll.
        first = fleet.start_worker()
        client = SimDynamoDBClient(fleet.engine, lambda: fleet.world.now)

        def fresh_poll() -> None:
            # A hint (for a connection that does not exist) ends its long poll; the
            # next one (SQS_WAIT_SECONDS, 10 s) begins at once.
            fleet.queue.send(json.dumps({"type": "reassign", "connection_id": "nowhere"}))

        def stray_then_sigterm() -> None:
            # Started (its hint never sent), and acquired by the first worker's live
            # session with the answer lost: the session's, run by nobody. Then, before
            # any own-check of the first worker's can see it, a SIGTERM.
            assert first.worker is not None
            gen = first.worker.standing.session_gen
            now_ms = int(fleet.world.now * 1000)
            url = fleet.router.url("stray")
            DesiredStateStore(client, TABLE).start("stray", url, now_ms)  # type: ignore[arg-type]
            update = lease_rules.acquire_update("stray", first.name, gen, now_ms, "t0")
            update_connection(
                client,  # type: ignore[arg-type]
                TABLE,
                "stray",
                update.as_kwargs(),
                return_values="NONE",
            )
            fleet.monitor.started("stray")
            fleet.monitor.event("stray: acquired by w1 unseen; SIGTERM to w1")
            first.terminate()

        fleet.world.at(START + 10.0, fresh_poll)
        fleet.world.at(START + 10.5, stray_then_sigterm)
        # The worker that takes over what the first leaves.
        fleet.world.at(START + 10.6, fleet.start_worker)

    violations = run_script(SHAPE, script, START + 40.0)
    assert violations == []
