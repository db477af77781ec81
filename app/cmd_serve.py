"""`medfaq serve`: the HTTP API over one index."""

from __future__ import annotations

from pathlib import Path

import typer

from app.options import INDEX
from retriever.setup_plan import set_up_index


def serve(
    index: Path | None = INDEX,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    workers: int = typer.Option(4, "--workers", min=1, help="Threads running searches at once."),
    allow_writes: bool = typer.Option(False, "--allow-writes", help="Enable POST /index/add and /index/delete."),
) -> None:
    """Serve search, feedback and the experts' queue over HTTP (OpenAPI page at /docs). Loads the pipeline once."""
    import uvicorn

    from app.server import ServerLimits, create_app
    from app.service import SearchService

    index = index or set_up_index()
    service = SearchService(index)
    app = create_app(service, allow_writes=allow_writes, limits=ServerLimits(workers=workers))
    typer.echo(f"serving {index} ({len(service.index)} FAQs) on http://{host}:{port} (OpenAPI: /docs)", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
