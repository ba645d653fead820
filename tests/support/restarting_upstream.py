"""An upstream on loopback that starts its sequence over, as services document for a
maintenance: after every ``restart_every`` messages it forgets its history and numbers
from 1 again, closing the sockets first (``close_on_restart``, a restart) or going on
in the same socket (a mid-stream reset). Numbered by a chain instead (``chain_step``):
each message carries ``prev``, the seq before it, and steps of that size.

Resumed with ``from_seq`` in the URL, within the current numbering; asked for a seq
the numbering has not reached (a client that knew the old one), it goes on from its
next message. Every message carries a unique ``id`` (run and seq), so a test can tell
what was lost from what was renumbered.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed


@dataclass
class RestartingUpstream:
    restart_every: int = 20
    close_on_restart: bool = True
    restarts_left: int = 1
    message_every: float = 0.02
    chain_step: int | None = None
    """Numbered by a chain: seqs go up by this much and each message names ``prev``."""
    skip_link_at: int | None = None
    """In a chain, the message with this index (1-based, in the run) is never sent: the
    next one's ``prev`` names a seq nobody got."""
    url: str = ""
    run: int = 1
    log: list[dict[str, Any]] = field(default_factory=list)
    """The current numbering's messages, in order."""
    sent_ids: list[str] = field(default_factory=list)
    """Every message sent, each id once, in the order first sent."""
    connections: int = 0
    _restarted: asyncio.Event = field(default_factory=asyncio.Event)

    def _produce(self) -> dict[str, Any]:
        index = len(self.log) + 1
        if self.chain_step is None:
            message: dict[str, Any] = {"seq": index}
        else:
            seq = index * self.chain_step
            message = {"seq": seq, "prev": (index - 1) * self.chain_step or None}
        message["id"] = f"run{self.run}-{index}"
        self.log.append(message)
        return message

    def _restart(self) -> None:
        self.run += 1
        self.log = []
        self.restarts_left -= 1
        self._restarted.set()
        self._restarted = asyncio.Event()

    def _start_index(self, from_seq: int) -> int:
        """Index into the log where a client asking for ``from_seq`` starts."""
        for index, message in enumerate(self.log):
            if message["seq"] >= from_seq:
                return index
        return len(self.log)

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.connections += 1
        query = parse_qs(urlsplit(ws.request.path).query)
        index = self._start_index(int(query.get("from_seq", ["1"])[0]))
        run = self.run
        try:
            while True:
                if self.run != run:  # restarted while this socket was open
                    if self.close_on_restart:
                        await ws.close(1012, "service restart")
                        return
                    run, index = self.run, 0
                if index >= len(self.log):
                    if self.restarts_left > 0 and len(self.log) >= self.restart_every:
                        self._restart()
                        continue
                    self._produce()
                message = self.log[index]
                index += 1
                skip = self.skip_link_at is not None and index == self.skip_link_at
                if not skip:
                    await ws.send(json.dumps(message))
                    if message["id"] not in self.sent_ids:
                        self.sent_ids.append(message["id"])
                await asyncio.sleep(self.message_every)
        except ConnectionClosed:
            pass
