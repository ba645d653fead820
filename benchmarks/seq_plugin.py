"""A protocol plug-in for runs that mix plug-ins with the built-in protocols: it reads
the demo feed as ``json-seq`` does, but is loaded by name from ``UPSTREAM_PROTOCOLS``
(``demo-seq=benchmarks.seq_plugin:factory``) and built fresh for each connection, as
any registered plug-in is. The chaos run starts every second connection with it."""

from __future__ import annotations

from worker.upstream_protocol import JsonSeqProtocol

NAME = "demo-seq"
SPEC = f"{__name__}:factory"


class DemoSeqProtocol(JsonSeqProtocol):
    """``json-seq`` as a plug-in (the demo feed's messages and ``from_seq`` resume)."""

    def configure(self, options: dict[str, object]) -> None:
        if options:
            raise ValueError(f"{NAME} takes no options, got {sorted(options)}")


def factory() -> DemoSeqProtocol:
    return DemoSeqProtocol()
