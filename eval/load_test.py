"""A bounded load test of `medfaq serve`: C concurrent clients send a fixed question set to ``POST /search``; every
answer is compared with the serial answer for the same question, and latency percentiles and requests/s printed.

    python -m medfaq.eval.load_test --url http://127.0.0.1:8000 --queries Q.jsonl --clients 1,4,8,16 --rounds 2

With ``--server-pid`` (Linux), the server process's CPU time per request is printed too: on a shared machine it
varies far less with the other processes' load than latency and throughput do.

Loopback servers only: the question count, the rounds and a per-request timeout bound every run.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from medfaq.eval.script_args import positive_int

REQUEST_TIMEOUT_S = 120.0


@dataclass
class LoadResult:
    clients: int
    requests: int
    errors: int
    mismatches: int
    p50_ms: float
    p95_ms: float
    requests_per_s: float
    server_cpu_ms: float | None = None  # the server's CPU time per answered request


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ranked_ids(answer: dict) -> list[str]:
    return [hit["id"] for hit in answer["hits"]]


def ask(client, question: str) -> dict:
    response = client.post("/search", json={"question": question})
    response.raise_for_status()
    return response.json()


def http_client(url: str):
    """An HTTP client as browsers and curl are: TCP_NODELAY set, so a request's body is not held back behind its
    headers until the server acknowledges them (Nagle's algorithm against delayed ACKs: about 40 ms a request)."""
    import socket

    import httpx

    transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S, transport=transport)


def serial_answers(url: str, questions: list[str]) -> dict[str, list[str]]:
    with http_client(url) as client:
        return {question: ranked_ids(ask(client, question)) for question in dict.fromkeys(questions)}


def run_load(
    url: str,
    questions: list[str],
    clients: int,
    expected: dict[str, list[str]],
    rounds: int = 1,
    server_pid: int | None = None,
) -> LoadResult:
    """Each of `clients` threads sends every question `rounds` times (in its own rotated order)."""
    import httpx

    latencies: list[float] = []
    errors = mismatches = 0
    guard = threading.Lock()

    def client_loop(offset: int) -> None:
        nonlocal errors, mismatches
        order = questions[offset % len(questions) :] + questions[: offset % len(questions)]
        with http_client(url) as client:
            for question in order * rounds:
                start = time.perf_counter()
                try:
                    ids = ranked_ids(ask(client, question))
                except (httpx.HTTPError, KeyError, ValueError):
                    with guard:
                        errors += 1
                    continue
                elapsed = (time.perf_counter() - start) * 1000
                with guard:
                    latencies.append(elapsed)
                    mismatches += ids != expected[question]

    cpu_start = cpu_seconds(server_pid) if server_pid else 0.0
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client_loop, range(clients)))
    wall = time.perf_counter() - start
    done = len(latencies)
    server_cpu = (cpu_seconds(server_pid) - cpu_start) * 1000 / done if server_pid and done else None
    return LoadResult(
        clients=clients,
        requests=done + errors,
        errors=errors,
        mismatches=mismatches,
        p50_ms=float(np.percentile(latencies, 50)) if done else float("nan"),
        p95_ms=float(np.percentile(latencies, 95)) if done else float("nan"),
        requests_per_s=done / wall if wall else 0.0,
        server_cpu_ms=server_cpu,
    )


def format_table(results: list[LoadResult]) -> str:
    lines = ["clients  requests  errors  mismatches  p50_ms  p95_ms  req/s  server_cpu_ms"]
    lines += [
        f"{r.clients:>7}  {r.requests:>8}  {r.errors:>6}  {r.mismatches:>10}  {r.p50_ms:>6.1f}  {r.p95_ms:>6.1f}"
        f"  {r.requests_per_s:>5.1f}  {'-' if r.server_cpu_ms is None else f'{r.server_cpu_ms:.1f}':>13}"
        for r in results
    ]
    return "\n".join(lines)


def _client_counts(text: str) -> list[int]:
    return [positive_int(count) for count in text.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m medfaq.eval.load_test", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--queries", type=Path, required=True, help="JSONL with a question (or BEIR text) per line")
    parser.add_argument("--limit", type=positive_int, default=50, help="use the first N questions")
    parser.add_argument("--clients", type=_client_counts, default=[1, 4, 16], help="comma-separated client counts")
    parser.add_argument("--rounds", type=positive_int, default=1)
    parser.add_argument("--server-pid", type=positive_int, help="also report this process's CPU time per request")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with args.queries.open(encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    questions = [row.get("question") or row["text"] for row in rows][: args.limit]
    expected = serial_answers(args.url, questions)
    results = [
        run_load(args.url, questions, clients, expected, args.rounds, args.server_pid) for clients in args.clients
    ]
    print(json.dumps([asdict(r) for r in results], indent=2) if args.json else format_table(results))


if __name__ == "__main__":
    main()
