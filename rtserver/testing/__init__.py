"""Helpers for tests and benchmarks: real servers on loopback, tiny checkpoints."""
