"""Built-in sinks: batch handlers that forward each message, as a
:class:`~wsfleet.envelope.Envelope`, to Kinesis Data Streams
(``HANDLER=worker.sinks.kinesis:factory``), Data Firehose (``worker.sinks.firehose``)
or an SQS FIFO queue (``worker.sinks.sqs_fifo``).

The decisions (how records are split into requests, what is sent again after a
partial failure, the SQS deduplication id) are pure functions in
:mod:`worker.sinks.batch_rules`; the retry loop is :mod:`worker.sinks.sending`; the
settings are read in :mod:`worker.sinks.settings`. Each service module is the thin
part that makes the requests.
"""
