"""Worked examples of the fleet against upstreams shaped like real ones."""
