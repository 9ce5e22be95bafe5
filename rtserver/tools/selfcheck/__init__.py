"""Self-checks run by hand against a real checkpoint on a GPU."""
