"""Safety and liveness rules broken on purpose, one at a time, for the simulator to find
(``python -m sim.recall``). Each break is a set of exact text replacements in the
shipped code; one that no longer applies (the code moved on) fails loudly rather than
testing nothing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Break:
    name: str
    why: str
    edits: tuple[tuple[str, str, str] | tuple[str, str, str, int], ...]
    """(file, text, replacement[, count]); each text must occur exactly ``count``
    times (once unless given), and every occurrence is replaced."""
    covered_by: str | None = None
    """Another rule that keeps this break harmless on its own (defence in depth): no
    seed can find it alone, and the break that drops both is in the list."""


_RENEW_OWN_ONLY = (
    "            if runner.lease.session_gen == gen:\n                runner.session_renewed"
)

BREAKS: tuple[Break, ...] = (
    Break(
        "F1",
        "a lease won under a session that is no longer live is run, and any renew"
        " extends every runner",
        (
            (
                "worker/ownership.py",
                "        if result.session_gen != self._standing.session_gen:\n",
                "        if False:\n",
            ),
            (
                "worker/session_cycle.py",
                _RENEW_OWN_ONLY,
                "            if True:\n                runner.session_renewed",
            ),
        ),
    ),
    Break(
        "F2",
        "a batched takeover keeps the old stream's resume point after a restart on a new stream",
        (
            (
                "wsfleet/lease_rules.py",
                "last_seq=resume_seq if same_stream else current.last_seq,",
                "last_seq=resume_seq,",
            ),
        ),
    ),
    Break(
        "F3",
        "one session item that does not decode stops every reconcile pass",
        (
            (
                "wsfleet/session_store.py",
                "                    try:\n"
                "                        session = SessionItem.from_dynamodb(raw, damaged=True)\n"
                "                    except MalformedItemError as error:\n"
                "                        report(error)\n"
                "                        continue\n",
                "                    session = SessionItem.from_dynamodb(raw, damaged=True)\n",
            ),
        ),
    ),
    Break(
        "P4",
        "a session item with an attribute of the wrong type is left out of every listing,"
        " so its connections are stranded once its worker is gone",
        (
            (
                "wsfleet/session_store.py",
                "session.problem))\n                    sessions.append(session)\n",
                "session.problem))\n                        continue\n"
                "                    sessions.append(session)\n",
            ),
        ),
    ),
    Break(
        "F4",
        "a renew attempt is abandoned after a third of a heartbeat, and a session that"
        " cannot be proven is never given up",
        (
            (
                "worker/aws_clients.py",
                "    per_attempt = timing.renew_attempt_timeout\n",
                "    per_attempt = max(0.2, timing.heartbeat / 3)\n",
            ),
            ("worker/renew_plan.py", "        if now >= self.give_up_at:\n", "        if False:\n"),
        ),
    ),
    Break(
        "F5",
        "a reap records no takeover plan: the old rules, where the survivors wait a"
        " heartbeat and race the reaper's stale room",
        (
            (
                "wsfleet/session_rules.py",
                "    if not takers:\n        return update\n",
                "    return update\n",
            ),
        ),
    ),
    Break(
        "F6",
        "a release that got no answer leaves its final checkpoint nowhere: the own-check"
        " releases the stray with the checkpoint the listing had",
        (
            (
                "wsfleet/lease_rules.py",
                "        return seen.last_seq\n    return max(seen.last_seq, kept.seq)\n",
                "        return seen.last_seq\n    return seen.last_seq\n",
            ),
            (
                "worker/checkpoint_pages.py",
                "        for cid, entry in self._holdings.unanswered.items():\n"
                "            entries.setdefault(cid, entry)\n",
                "",
            ),
        ),
    ),
    Break(
        "F7",
        "a runner cancelled at shutdown is neither released nor hinted: its task ends"
        " with UnboundLocalError before its slot, hand-off and hint",
        (
            (
                "worker/ownership.py",
                "        outcome: Outcome | None = None\n"
                "        cancelled = False\n"
                "        try:\n"
                "            outcome = await runner.run()\n"
                "        except asyncio.CancelledError:\n"
                "            cancelled = True\n"
                "            outcome = runner.outcome\n"
                "        except Exception:\n",
                "        cancelled = False\n"
                "        try:\n"
                "            outcome = await runner.run()\n"
                "        except Exception:\n"
                "            outcome = None\n",
            ),
        ),
    ),
    Break(
        "F8",
        "the connections a burst of stops names are read one at a time",
        (
            (
                "worker/notices.py",
                "            items = await loop.run_in_executor("
                "None, self._store.get_many, running)\n",
                "            items = {}\n"
                "            for one in running:\n"
                "                got = await loop.run_in_executor(None, self._store.get, one)\n"
                "                if got is not None:\n"
                "                    items[one] = got\n",
            ),
        ),
    ),
    Break(
        "fence check dropped",
        "a handler call starts whatever the fence deadline says",
        (
            ("worker/message_pump.py", "if clock() < state.go_until:", "if True:", 2),
            (
                "worker/message_pump.py",
                "                call_now = state.before_call(loop.time())\n",
                "                call_now = Call.GO\n",
            ),
        ),
    ),
    Break(
        "renew extends another session's runners",
        "a renew of a later session resumes runners of a reaped one",
        (
            (
                "worker/session_cycle.py",
                _RENEW_OWN_ONLY,
                "            if True:\n                runner.session_renewed",
            ),
        ),
        covered_by="a lost session's runners are stopped before the next session opens"
        " (F1 drops both)",
    ),
    Break(
        "epoch clause dropped from a takeover",
        "a takeover is not conditioned on the epoch it read",
        (("wsfleet/lease_rules.py", '            ("#epoch", seen.lease_epoch),\n', ""),),
        covered_by="the takeover's dead owner clause: a second taker finds the first as owner",
    ),
    Break(
        "renew of a reaped session passes",
        "a session's renew is not conditioned on its being ALIVE: a reaped worker goes on",
        (
            (
                "wsfleet/session_rules.py",
                "        # ALIVE only: a reaped session never passes again, however late its"
                " renew.\n"
                '        condition_expression="#state = :alive",',
                '        condition_expression="#state = :alive OR #state <> :alive",',
            ),
        ),
    ),
    Break(
        "takeover without the dead owner's clause",
        "a takeover decided on a listing does not check the owner is still the dead session",
        (
            (
                "wsfleet/lease_rules.py",
                'f"#owner = :dead AND #sgen = :deadgen AND #state = :started AND {read}"',
                'f"(#owner = :dead OR attribute_exists(#owner)) AND (#sgen = :deadgen OR'
                ' attribute_exists(#sgen)) AND #state = :started AND {read}"',
            ),
        ),
        covered_by="the takeover's epoch clause: a second taker read the epoch the first"
        " one moved on",
    ),
    Break(
        "takeover with neither the dead owner's nor the epoch clause",
        "a takeover decided on a listing checks neither that the owner is still the dead"
        " session nor that the epoch is the one it read (each alone is covered by the"
        " other: two takers of one connection cannot both pass either)",
        (
            ("wsfleet/lease_rules.py", '            ("#epoch", seen.lease_epoch),\n', ""),
            (
                "wsfleet/lease_rules.py",
                'f"#owner = :dead AND #sgen = :deadgen AND #state = :started AND {read}"',
                'f"(#owner = :dead OR attribute_exists(#owner)) AND (#sgen = :deadgen OR'
                ' attribute_exists(#sgen)) AND #state = :started AND {read}"',
            ),
        ),
    ),
    Break(
        "reap by wall clock",
        "a session is reaped once the expiry its writer stamped by its wall clock has passed"
        " by the reaper's wall clock (the old rule, without its skew term)",
        (
            (
                "worker/reconciler.py",
                "        if self.watch.lapsed(session, self._clock()):\n",
                "        if session.reapable and session.expires_at_ms < self._wall_ms():\n",
            ),
        ),
    ),
    Break(
        "expiry counted from the first sighting",
        "a reaper counts a session's lease from when it first listed it, not from the"
        " last change of its beat",
        (
            (
                "wsfleet/session_watch.py",
                "            if old is None or old.beat != session.beat"
                " or old.state != session.state:\n"
                "                old = _Sighting(session.beat, session.state, now)\n",
                "            if old is None or old.state != session.state:\n"
                "                old = _Sighting(session.beat, session.state, now)\n"
                "            else:\n"
                "                old = _Sighting(session.beat, session.state, old.since)\n",
            ),
        ),
    ),
    Break(
        "fence from the renew's answer",
        "the fence deadline counts from when a renew's answer arrived, not from its send",
        (
            (
                "worker/session.py",
                "                    self.session_gen,\n                    answer.sent_at,\n",
                "                    self.session_gen,\n                    now,\n",
            ),
        ),
    ),
    Break(
        "checkpoint before the handler returns",
        "the checkpoint passes a message before its handler call has returned",
        (
            (
                "worker/message_pump.py",
                "                failure = await call(task, handle, delivery)\n",
                "                state.call_returned(seq)\n"
                "                failure = await call(task, handle, delivery)\n",
            ),
        ),
    ),
    Break(
        "release without its seq_gen clause",
        "a final checkpoint is written over a restart's reset",
        (
            (
                "wsfleet/lease_rules.py",
                '        names |= _names("#seq", "#seqgen")\n'
                "        values |= _values(seq=last_seq) | stream_values\n",
                '        names |= _names("#seq")\n        values |= _values(seq=last_seq)\n',
            ),
            (
                "wsfleet/lease_rules.py",
                '        condition += f" AND {stream_clause}"\n',
                "",
            ),
        ),
    ),
    Break(
        "acquire of an owned connection",
        "an acquire does not require the connection to be free",
        (
            (
                "wsfleet/lease_rules.py",
                '"#state = :started AND attribute_not_exists(#parked) AND'
                ' attribute_not_exists(#owner)"',
                '"#state = :started AND attribute_not_exists(#parked)"',
            ),
        ),
    ),
    Break(
        "stop notice ignored",
        "a runner whose connection was stopped keeps running",
        (
            (
                "worker/notices.py",
                "    if not item.started:\n        return Ending.STOPPED\n",
                "",
            ),
        ),
    ),
    Break(
        "P1",
        "at shutdown the session is retired only once the start-queue poll in flight"
        " returned, so what it owns and nobody runs waits for the poll",
        (
            (
                "worker/lifecycle.py",
                "        await self._retire_session()\n        handed_back = await drained\n",
                "        handed_back = await drained\n        await self._retire_session()\n",
            ),
        ),
    ),
    Break(
        "P2",
        "a slow worker's calls keep to the short attempts, so its acquires land unseen"
        " and its listings never come",
        (
            (
                "worker/patient_calls.py",
                "            method = patient if self.trips.slow else short\n",
                "            method = short\n",
            ),
        ),
    ),
    Break(
        "P3",
        "a stop notice ends its runner only once the named item is read, so a worker"
        " whose reads are slow delivers past the stop bound",
        (
            (
                "worker/notices.py",
                "        for cid in session_rules.stopped_by_notice(tokens):\n",
                "        for cid in ():\n",
            ),
        ),
    ),
    Break(
        "P5",
        "the simulator lets an exited worker's long poll wake after the exit and take a"
        " start hint that then stays invisible with nobody to act on it",
        (
            (
                "sim/aws.py",
                "            if self._exited:\n                return {}\n",
                "",
            ),
        ),
    ),
    Break(
        "sequence restart taken for copies",
        "an upstream that starts its numbering over after a reconnect has its new"
        " messages dropped as copies of the old ones",
        (
            (
                "worker/connection_state.py",
                "            if restarts is Restarts.ANYTIME or (first and restarts is"
                " Restarts.ON_CONNECT):\n",
                "            if restarts is Restarts.ANYTIME:\n",
            ),
        ),
    ),
    Break(
        "renew thread asks for a running loop",
        "the load the renew thread publishes reads asyncio.get_running_loop(), which a"
        " thread of its own has not",
        (
            (
                "worker/fleet_worker.py",
                "            monotonic=lambda: self._clock(),\n",
                "            monotonic=lambda: asyncio.get_running_loop().time(),\n",
            ),
        ),
    ),
)
