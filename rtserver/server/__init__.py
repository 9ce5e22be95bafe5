"""The asyncio shell: websockets server, HTTP endpoints, per-connection tasks."""
