"""The worker: owns long-lived upstream WebSocket connections through DynamoDB leases.

Run it with ``python -m worker``; it is configured by the environment (docs/DESIGN.md §4.9).
"""
