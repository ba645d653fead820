"""Structured JSON logs on stderr (EMF metric lines own stdout)."""

from __future__ import annotations

import logging
import sys

from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter


def configure(*, level: str, service: str, worker_id: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LambdaPowertoolsFormatter(service=service, worker_id=worker_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # botocore and websockets are chatty at DEBUG/INFO; their warnings still show.
    for noisy in ("botocore", "boto3", "urllib3", "websockets"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
