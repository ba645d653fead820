"""``python -m worker``: run one worker process until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from worker import event_loops, json_decoding, logs, loop_watch
from worker.aws_clients import make_clients
from worker.config import ConfigError, WorkerConfig, check_installed, ignored_settings
from worker.credentials import SecretCache, secrets_manager_reader
from worker.delivery import load_handler
from worker.fleet_worker import Worker, WorkerDeps
from worker.plugins import PluginError
from worker.protocol_plugins import default_protocol, load_plugins
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore

log = logging.getLogger("worker")

AWS_THREADS = 32


async def serve(config: WorkerConfig, deps: WorkerDeps) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(AWS_THREADS, thread_name_prefix="aws"))
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    worker = Worker(config, deps)
    # Everything built so far lives as long as the process: keep it out of the
    # collector's generations, and from now on freeze what survives each full
    # collection, so that the collector's pauses (measured as the main source of
    # event-loop lag at 1,000 connections) stay short (worker.loop_watch).
    freezer = loop_watch.GcFreezer(worker.metrics, loop)
    freezer.install()
    try:
        await worker.run(stop)
    finally:
        freezer.uninstall()


def main() -> int:
    try:
        config = WorkerConfig.from_env()
        check_installed(config)
    except ConfigError as error:
        print(f"worker: configuration error: {error}", file=sys.stderr)
        return 2
    logs.configure(level=config.log_level, service=config.service_name, worker_id=config.worker_id)
    for line in ignored_settings(os.environ):
        log.warning(line)
    try:
        handler = load_handler(config.handler)
        plugins = load_plugins(config.upstream_protocols, config.upstream_protocol)
        protocol = default_protocol(config.upstream_protocol, plugins)
    except PluginError as error:
        log.error("plug-in error", extra={"error": str(error)})
        return 2
    clients = make_clients(
        config.timing, sqs_wait_seconds=config.sqs_wait_seconds, pool_size=AWS_THREADS
    )
    store = LeaseStore(clients.dynamodb, config.table_name, config.timing)
    deps = WorkerDeps(
        store=store,
        sessions=SessionStore(clients.dynamodb, config.table_name, config.timing),
        renewals=SessionStore(clients.renewals, config.table_name, config.timing),
        sqs=clients.sqs,
        sqs_poll=clients.sqs_poll,
        dynamodb_path=clients.dynamodb_path,
        handler=handler,
        protocol=protocol,
        plugins=plugins,
        secrets=SecretCache(
            secrets_manager_reader(clients.secrets), ttl=config.secret_cache_seconds
        ),
    )
    json_decoding.use(config.json_decoder)
    with asyncio.Runner(loop_factory=event_loops.factory(config.event_loop)) as runner:
        runner.run(serve(config, deps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
