"""The asyncio shell: uvicorn (ASGI) serving HTTP and the WebSocket, per-connection tasks."""
