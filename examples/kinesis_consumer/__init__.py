"""A Lambda consumer of the fleet's Kinesis sink that applies each message once
(:mod:`.handler`), and its CDK construct (:mod:`.construct`); README.md in this
directory walks through both."""
