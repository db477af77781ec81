"""`medfaq serve`: the HTTP API over one index."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Any

import typer

from medfaq.app.batching import BatchSettings
from medfaq.app.options import INDEX, port_option
from medfaq.common.runtime import MedfaqError
from medfaq.retriever.runs import check_output, write_text_atomic
from medfaq.retriever.trained_models import set_up_index

SERVE_THREADS = 1
"""Threads per model run and vector search: one, so that concurrent requests share the cores without contention
(measured on 2 cores, docs/results.md, "HTTP API under load")."""


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before any model loads: a port in use is one line at once, not after loading."""
    try:
        family, kind, protocol, *_ = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise MedfaqError(f"cannot listen on {host}: {error.strerror}") from None
    sock = socket.socket(family, kind, protocol)  # IPPROTO_TCP: asyncio then sets TCP_NODELAY on each connection
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart may reuse the port
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise MedfaqError(f"port {port} on {host} is in use") from None
        raise MedfaqError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def run_server(app: Any, sock: socket.socket, url: str, ready_file: Path | None) -> None:
    """Serve `app` on `sock` until stopped. Once it accepts connections it says ``ready on URL`` on stderr and
    writes `url` to `ready_file`, which it removes again when it stops."""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                typer.echo(f"ready on {url}", err=True)
                if ready_file is not None:
                    write_text_atomic(ready_file, [url + "\n"])

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if ready_file is not None:
                ready_file.unlink(missing_ok=True)
            await super().shutdown(sockets)

    AnnouncingServer(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def serve(
    index: Path | None = INDEX,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = port_option(8000, "Port to listen on."),
    workers: int = typer.Option(4, "--workers", min=1, help="Threads running searches at once."),
    threads: int = typer.Option(
        SERVE_THREADS, "--threads", min=1, help="Threads of each model run and vector search (OMP_NUM_THREADS)."
    ),
    batch_size: int = typer.Option(
        BatchSettings.max_size, "--batch-size", min=1, help="Most single-question requests searched as one batch."
    ),
    batch_wait_ms: float = typer.Option(
        BatchSettings.max_wait_ms,
        "--batch-wait-ms",
        min=0,
        max=1000,
        help="How long a request waits for others to join its batch (0: only those already waiting).",
    ),
    parallel_batches: int = typer.Option(
        0,
        "--parallel-batches",
        min=0,
        help="Batches searched at the same time (0: the usable cores divided by --threads).",
    ),
    allow_writes: bool = typer.Option(
        False,
        "--allow-writes",
        help="Enable the endpoints that change the index: POST /index/add, /index/delete, /index/adapt (in the "
        "background; GET /index/adapt says how it went), and the experts' "
        "/queue/{group_id}/link, /queue/{group_id}/answer, /queue/{group_id}/split, /queue/{group_id}/undo and "
        "/queue/merge; without MEDFAQ_API_KEY from loopback clients only.",
    ),
    allow_public_writes: bool = typer.Option(
        False,
        "--allow-public-writes",
        help="With --allow-writes and without MEDFAQ_API_KEY, accept the changes from any client, not loopback only.",
    ),
    allow_public_queue: bool = typer.Option(
        False,
        "--allow-public-queue",
        help="Without MEDFAQ_API_KEY, serve the experts' queue (consumers' questions: GET /unanswered and GET /queue) "
        "to any client, not loopback only.",
    ),
    ready_file: Path | None = typer.Option(
        None,
        "--ready-file",
        help="Write the server's URL to this file once it accepts connections (removed when it stops); a script "
        "waits for it (the line 'ready on URL' on stderr says the same).",
    ),
) -> None:
    """Serve search, feedback and the experts' queue over HTTP (OpenAPI page at /docs). Loads the pipeline once (a
    few seconds), then says 'ready on URL' on stderr."""
    from medfaq.app.server import ServerLimits, access_rules, create_app
    from medfaq.app.service import SearchService

    if allow_public_writes and not allow_writes:
        raise MedfaqError("--allow-public-writes opens the writes of --allow-writes: give both")
    if ready_file is not None:
        check_output(ready_file)
        ready_file.unlink(missing_ok=True)  # an earlier run's: the file appears only once this server is ready
    index = index or set_up_index()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by ONNX Runtime, faiss and torch when they load
    sock = listening_socket(host, port)
    parallel = parallel_batches or max(1, usable_cores() // threads)
    service = SearchService(index, batching=BatchSettings(batch_size, batch_wait_ms, parallel))
    access = dict(
        allow_writes=allow_writes, allow_public_queue=allow_public_queue, allow_public_writes=allow_public_writes
    )
    app = create_app(service, limits=ServerLimits(workers=workers), **access)
    typer.echo(f"serving {index} ({len(service.index)} FAQs) on http://{host}:{port} (OpenAPI: /docs)", err=True)
    for rule in access_rules(**access):
        typer.echo(f"access: {rule}", err=True)
    run_server(app, sock, f"http://{host}:{port}", ready_file)
