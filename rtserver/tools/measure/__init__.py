"""Measurements behind the numbers cited in docs and code comments (run by hand)."""
