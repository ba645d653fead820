"""Benchmarks, the chaos run and the cost model: scripts that print figures."""
