"""What the router, the worker and the stacks share: the connection item schema,
the pure lease rules, the DynamoDB lease store and the start-queue messages."""
