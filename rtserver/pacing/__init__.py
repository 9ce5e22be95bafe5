"""Pacing: jitter-buffer hints for the listener (pure maths)."""
