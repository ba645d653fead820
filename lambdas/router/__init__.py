"""The router: turns HTTP API and EventBridge start/stop requests into desired state
in the connection table and start hints on the queue (docs/DESIGN.md §5)."""
