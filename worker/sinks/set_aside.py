"""The production :data:`~worker.sinks.sending.SetAsideReport`: a set-aside message is
logged (an error, with its connection, seqs, reason and an excerpt) and counted as
``SinkMessagesSetAside`` in the worker's namespace, one EMF line per message (they are
rare; the alarm of that name fires on one)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Final, TextIO

from worker.sinks.sending import SetAsideNotice
from wsfleet import metric_names as m

log = logging.getLogger(__name__)

METRICS_NAMESPACE: Final = "METRICS_NAMESPACE"
SERVICE_NAME: Final = "SERVICE_NAME"


def report(notice: SetAsideNotice, out: TextIO | None = None) -> None:
    envelope = notice.envelope
    why = envelope.set_aside
    log.error(
        "message set aside: it can never be sent; its place in the stream holds the reason",
        extra={
            "connection_id": envelope.connection_id,
            "epoch": envelope.epoch,
            "seq_gen": envelope.seq_gen,
            "seq": envelope.seq,
            "sink": notice.service,
            "destination": notice.destination,
            "reason": why.reason if why else None,
            "detail": why.detail if why else None,
            "bytes": why.bytes if why else None,
            "payload_excerpt": notice.excerpt,
        },
    )
    emf_line(out or sys.stdout)


def emf_line(out: TextIO) -> None:
    """One EMF document: ``SinkMessagesSetAside`` = 1 under the worker's namespace and
    ``Service`` dimension (the names the alarm reads)."""
    namespace = os.environ.get(METRICS_NAMESPACE) or m.DEFAULT_NAMESPACE
    service = os.environ.get(SERVICE_NAME) or m.DEFAULT_SERVICE_NAME
    document = {
        "_aws": {
            "Timestamp": _now_ms(),
            "CloudWatchMetrics": [
                {
                    "Namespace": namespace,
                    "Dimensions": [[m.SERVICE_DIMENSION]],
                    "Metrics": [{"Name": m.SINK_MESSAGES_SET_ASIDE, "Unit": "Count"}],
                }
            ],
        },
        m.SERVICE_DIMENSION: service,
        m.SINK_MESSAGES_SET_ASIDE: 1,
    }
    out.write(json.dumps(document, separators=(",", ":")) + "\n")
    out.flush()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
