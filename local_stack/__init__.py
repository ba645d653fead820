"""The embedded local stack: a demo upstream feed and the local servers as child processes."""
