"""``speculative serve``: an OpenAI-compatible HTTP server with speculative decoding.

:mod:`.protocol` (request bodies), :mod:`.scheduler` (continuous batching of
speculative steps), :mod:`.metrics` (Prometheus), :mod:`.app` (FastAPI routes).
"""

from .app import ServerState, create_app, listening_socket, run_server

__all__ = ["ServerState", "create_app", "listening_socket", "run_server"]
