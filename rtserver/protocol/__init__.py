"""The wire contract of PROTOCOL.md: typed messages, binary frames, session."""
