"""Checkpoint writers in upstream layouts with random weights (tests, benchmarks)."""
