"""Connections of ``python -m service serve`` over raw sockets: head and body deadlines, the
connection bound, and one JSON envelope for what the HTTP parser refuses
(service/api/http_protocol.py)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from service.graph.generate import write_generated_edge_list
from service.ledger import upgrade
from tests.api_support import (
    GRAPH_EDGES,
    GRAPH_NODES,
    Backend,
    Server,
    free_port,
    open_ledger,
    user_with_key,
    uvicorn_server,
)
from tests.connection_support import new_connection_each

# one server for the module (served): its tests run on one xdist worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_http_connections")]

HEAD_TIMEOUT = 2
BODY_TIMEOUT = 2
WRITE_TIMEOUT = 2
MAX_CONNECTIONS = 4
#: Bound on how long a test waits for an answer that should come (never a timing assertion).
WAIT_SECONDS = 30.0


@dataclass
class Served:
    server: Server
    host: str
    port: int
    database_url: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("connections")
    graph_path = tmp / "graph.txt"
    write_generated_edge_list(graph_path, GRAPH_NODES, GRAPH_EDGES, seed=7)
    url = f"sqlite:///{tmp / 'ledger.db'}"
    upgrade(url)
    env = {
        "PPR_HTTP_HEAD_TIMEOUT_SECONDS": str(HEAD_TIMEOUT),
        "PPR_HTTP_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        "PPR_HTTP_WRITE_TIMEOUT_SECONDS": str(WRITE_TIMEOUT),
        "PPR_HTTP_KEEP_ALIVE_SECONDS": "600",  # held connections stay for the bound's test
        "PPR_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    }
    backend = Backend("sqlite", url, None, graph_path)
    with uvicorn_server(backend, extra_env=env, forked=True) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        yield Served(server, host, int(port), url)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, str]:
        parsed = json.loads(self.body)
        assert set(parsed) == {"error"}, parsed
        return dict(parsed["error"])


def connect(served: Served) -> socket.socket:
    sock = socket.create_connection((served.host, served.port), timeout=WAIT_SECONDS)
    return sock


def read_reply(sock: socket.socket) -> Reply:
    """One response (its head, then Content-Length bytes of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        body += chunk
    return Reply(int(status_line.split()[1]), headers, body[:length])


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def exchange(served: Served, raw: bytes) -> tuple[Reply, bool]:
    with connect(served) as sock:
        sock.sendall(raw)
        reply = read_reply(sock)
        return reply, closed_by_server(sock)


def drip(sock: socket.socket, data: bytes, *, most: int) -> int:
    """Send ``data`` one byte a second (at most ``most`` bytes), stopping as soon as the server
    answers; the number of bytes sent."""
    for sent, byte in enumerate(data[:most]):
        readable, _, _ = select.select([sock], [], [], 1.0)
        if readable:
            return sent
        sock.sendall(bytes([byte]))
    return len(data[:most])


def test_a_connection_that_sends_nothing_gets_408_and_is_closed(served: Served) -> None:
    with connect(served) as sock:
        reply = read_reply(sock)
        assert reply.status == 408 and reply.error()["code"] == "request_timeout"
        assert "PPR_HTTP_HEAD_TIMEOUT_SECONDS" in reply.error()["message"]
        assert reply.headers["connection"] == "close"
        assert closed_by_server(sock)


def test_one_header_byte_a_second_is_cut_off(served: Served) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"p" * 40 + b"\r\n\r\n"
    with connect(served) as sock:
        sent = drip(sock, request, most=5 * HEAD_TIMEOUT)
        assert sent < len(request)
        reply = read_reply(sock)
        assert reply.status == 408 and reply.error()["code"] == "request_timeout"
        assert closed_by_server(sock)


def test_a_batch_body_at_one_byte_a_second_is_refused_and_charges_nothing(
    served: Served,
) -> None:
    account_id, key = user_with_key(served.database_url, "12")
    items = [{"node_id": str(i)} for i in range(200)]
    body = json.dumps({"items": items, "k": 5}).encode()
    head = (
        "POST /v1/ppr/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(served) as sock:
        sock.sendall(head)
        sent = drip(sock, body, most=5 * BODY_TIMEOUT)
        assert sent < len(body)
        reply = read_reply(sock)
        assert reply.status == 408 and reply.error()["code"] == "request_timeout"
        assert "PPR_HTTP_BODY_TIMEOUT_SECONDS" in reply.error()["message"]
        assert closed_by_server(sock)
    with open_ledger(served.database_url) as ledger:
        assert ledger.budgets.budget(account_id).charges == 0


def test_a_client_that_never_reads_a_large_answer_is_cut_off(served: Served) -> None:
    """A batch call whose answer (several MB: 1,000 popular items of k=399) is far larger than
    the socket buffers, from a client that never reads: uvicorn pauses writing, and after
    PPR_HTTP_WRITE_TIMEOUT_SECONDS the connection is aborted. Reading afterwards gets a cut
    answer (then the end of the stream or a reset), never the whole of it. Before, the
    connection was held, and the whole answer sent once the client read, for as long as it
    waited."""
    with open_ledger(served.database_url) as ledger:
        service = ledger.accounts.create_account(
            "service", cap_epsilon=5.0, delta=1e-6, modes=["edge"]
        )
        key, _ = ledger.api_keys.create_api_key(service.account_id)
    nodes = [str(i % GRAPH_NODES) for i in range(1000)]
    body = json.dumps(
        {"nodes": nodes, "k": GRAPH_NODES - 1, "mode": "edge", "mechanism": "popular"}
    ).encode()
    head = (
        "POST /v1/ppr/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    before = len(served.server.log_lines())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(WAIT_SECONDS)
    with sock:
        sock.connect((served.host, served.port))
        sock.sendall(head + body)

        def cut_off() -> bool:
            return any(
                "PPR_HTTP_WRITE_TIMEOUT_SECONDS" in str(line.get("message"))
                for line in served.server.log_lines()[before:]
            )

        deadline = time.monotonic() + 4 * WAIT_SECONDS
        while not cut_off():
            assert time.monotonic() < deadline, "the server kept a client that never reads"
            time.sleep(0.5)
        received = b""
        try:
            while chunk := sock.recv(1 << 20):
                received += chunk
        except ConnectionResetError:
            pass
    head_part, _, got = received.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 200"), head_part[:100]
    length = int(next(
        line.split(b":", 1)[1] for line in head_part.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ))  # fmt: skip
    assert len(got) < length, "the whole answer arrived: the connection was never cut"
    with connect(served) as check:  # the worker serves on
        check.sendall(_HEALTHZ + b"\r\n")
        assert read_reply(check).status == 200


def test_a_request_in_time_on_a_kept_alive_connection_is_served(served: Served) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with connect(served) as sock:
        for _ in range(3):
            sock.sendall(request)
            reply = read_reply(sock)
            assert reply.status == 200 and json.loads(reply.body) == {"status": "ok"}


_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
_BATCH = b"POST /v1/ppr/batch HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        pytest.param(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
                     "uri_too_long", id="url-over-the-limit"),
        pytest.param(b"GET /v1/ppr/\xff HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed_request",
                     id="raw-0xff-in-path"),
        pytest.param(_HEALTHZ + b"X-A: a\x01b\r\n\r\n", 400, "malformed_request",
                     id="control-char-in-header"),
        pytest.param(_BATCH + b"Content-Length: -1\r\n\r\n", 400, "malformed_request",
                     id="negative-content-length"),
        pytest.param(_BATCH + b"Content-Length: 99999999999999999999999\r\n\r\n", 400,
                     "malformed_request", id="huge-content-length"),
        pytest.param(_BATCH + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400,
                     "malformed_request", id="duplicate-content-length"),
        pytest.param(b"HELLO WORLD\r\n\r\n", 400, "malformed_request", id="garbage-request-line"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, 400,
                     "malformed_request", id="tls-hello-on-plain-http"),
        pytest.param(_HEALTHZ + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n", 431,
                     "headers_too_large", id="headers-over-the-limit"),
    ],
)  # fmt: skip
def test_what_the_parser_refuses_is_answered_in_the_envelope(
    served: Served, raw: bytes, status: int, code: str
) -> None:
    reply, closed = exchange(served, raw)
    assert reply.status == status
    assert reply.headers["content-type"] == "application/json"
    error = reply.error()
    assert error["code"] == code and error["message"]
    assert closed


def test_a_request_beyond_the_connection_bound_gets_503_in_the_envelope(served: Served) -> None:
    held = [connect(served) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in held:  # each served, then kept alive (PPR_HTTP_KEEP_ALIVE_SECONDS=600)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(sock).status == 200
        reply, closed = exchange(served, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reply.status == 503 and reply.error()["code"] == "overloaded"
        assert "PPR_HTTP_MAX_CONNECTIONS" in reply.error()["message"]
        assert reply.headers["retry-after"] == "1"
        assert closed
        held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the held ones still work
        assert read_reply(held[0]).status == 200
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + WAIT_SECONDS
    again = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    while exchange(served, again)[0].status != 200:
        assert time.monotonic() < deadline, "the bound should free up once connections close"
        time.sleep(0.1)


def _limit_check(soft: int, hard: int, max_connections: int) -> tuple[str, str]:
    """``ensure_open_file_limit`` in a child process started with these limits: its warning
    (or "None") and the soft limit afterwards."""
    code = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from service.api.open_files import ensure_open_file_limit\n"
        "from service.config import Settings\n"
        f"print(ensure_open_file_limit(Settings(http_max_connections={max_connections})))\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()  # fmt: skip
    return out[0], out[1]


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    warning, soft = _limit_check(512, 4096, 1000)
    assert warning == "None" and soft == "4096"


def test_an_open_file_limit_below_the_bound_is_warned_about() -> None:
    warning, soft = _limit_check(256, 512, 2048)
    assert "RLIMIT_NOFILE" in warning and "PPR_HTTP_MAX_CONNECTIONS=2048" in warning
    assert soft == "512"


def test_serve_warns_at_start_up_when_the_open_file_limit_is_too_low(served: Served) -> None:
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    graph = served.server.log_path.parent / "graph.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--graph", str(graph),
         "--port", str(free_port()), "--database-url", served.database_url],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=low_limit,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the check runs before uvicorn starts
            seen.append(line)
            if "RLIMIT_NOFILE" in line or "Waiting for application startup" in line:
                break
        assert "RLIMIT_NOFILE" in seen[-1], "".join(seen)
        assert json.loads(seen[-1])["level"] == "warning"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_flood_of_idle_connections_beyond_the_file_limit_leaves_every_new_client_answered(
    served: Served, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 31's minimal case: one worker, PPR_HTTP_MAX_CONNECTIONS=20, an open-file limit of
    100 (soft and hard) and 400 connections that send nothing. Before, the worker ran out of
    descriptors and new clients were closed without an answer (0 of 50); now the oldest idle
    connections are shed with a 503 and every new request gets an HTTP answer."""
    import resource

    import httpx

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    graph = served.server.log_path.parent / "graph.txt"
    port = free_port()
    log_path = tmp_path_factory.mktemp("flood") / "server.log"
    env = {**os.environ, "PPR_HTTP_MAX_CONNECTIONS": "20", "PPR_LOG_LEVEL": "info",
           "PPR_GRAPH_SNAPSHOT_DIR": str(graph.parent / "graph-snapshots"),
           "PPR_PREFIX_TABLE_BYTES": "0"}  # fmt: skip
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--graph", str(graph),
             "--port", str(port), "--database-url", served.database_url],
            stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=low_limit, env=env,
        )  # fmt: skip
    idle: list[socket.socket] = []
    # every request below is a new client's: a new connection each (none kept alive)
    fresh = new_connection_each(f"http://127.0.0.1:{port}", timeout=WAIT_SECONDS)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if fresh.get("/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "server not ready in 120 s"
            time.sleep(0.2)
        for _ in range(400):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT_SECONDS))
        outcomes: Counter[str] = Counter()
        for _ in range(50):
            try:
                response = fresh.get("/healthz")
            except httpx.HTTPError as exc:
                outcomes[type(exc).__name__] += 1
                continue
            if response.status_code == 503:
                assert response.json()["error"]["code"] == "overloaded"
                assert response.headers["retry-after"] == "1"
            outcomes[str(response.status_code)] += 1
        assert set(outcomes) <= {"200", "503"} and sum(outcomes.values()) == 50, outcomes
        shed = [
            line for line in log_path.read_text().splitlines() if "at its connection bound" in line
        ]
        assert shed, "shedding is logged"
        metrics = fresh.get("/metrics").text
        assert 'ppr_http_connections_shed_total{action="shed"}' in metrics
    finally:
        fresh.close()
        for sock in idle:
            sock.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
