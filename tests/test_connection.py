"""The engine's connection to the service (auto/connection.py): keep-alive connections reused, one
the server closed while idle replaced without a failure, concurrent callers on connections of their
own, and every failure an error that says what happened. Unit tests against a stand-in HTTP server
of the standard library (the client's connections are under test, not the service: the service's
own round trips are tests/test_predictor.py's and tests/test_reliability.py's)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from auto import connection
from auto.connection import ServiceConnection, StatusError, TimedOut, Unreachable
from cli.processes import free_port


class StandIn(BaseHTTPRequestHandler):
    """Echoes the body with the path and the connection's own number; /close answers keep-alive and
    then closes (what uvicorn does to a connection idle past its keep-alive), /slow sleeps a second,
    /refuse answers 422 as FastAPI words it, /moved 307."""

    protocol_version = "HTTP/1.1"
    opened = itertools.count()  # connections numbered as accepted (an id() is reused once freed)

    def setup(self) -> None:
        super().setup()
        self.number = next(self.opened)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self._answer(200, {"path": self.path, "body": body.decode(), "connection": self.number})

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/refuse":
            return self._answer(422, {"detail": "memory_budget_mb: no candidate fits 1 MB"})
        if self.path == "/moved":
            return self._answer(307, {"detail": "elsewhere"})
        self._answer(200, {"path": self.path, "connection": self.number})
        self.close_connection = self.path == "/close"

    def _answer(self, status: int, said: dict) -> None:
        data = json.dumps(said).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def said(raw: bytes) -> dict:
    return json.loads(raw)


def test_a_connection_is_kept_alive_and_a_body_arrives_whole(url):
    client = ServiceConnection(url, 2.0)
    first, again = said(client.post("/v1/chunk-size", b'{"n": 1}')), said(client.post("/v1/chunk-size", b'{"n": 2}'))
    assert (first["body"], again["body"]) == ('{"n": 1}', '{"n": 2}')
    assert first["connection"] == again["connection"]  # one connection, reused
    client.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(url):
    client = ServiceConnection(url, 2.0)
    closed = said(client.get("/close"))  # answered keep-alive, then closed by the server
    time.sleep(0.1)
    after = said(client.get("/model"))
    assert after["path"] == "/model" and after["connection"] != closed["connection"]


def test_a_connection_idle_near_the_server_s_keep_alive_is_not_reused(url, monkeypatch):
    monkeypatch.setattr(connection, "IDLE_S", 0.5)  # uvicorn's 5 s, in small: a close could cross the request
    client = ServiceConnection(url, 2.0)
    first = said(client.get("/a"))["connection"]
    assert said(client.get("/b"))["connection"] == first
    time.sleep(1.0)
    assert said(client.get("/c"))["connection"] != first


def test_the_url_s_path_prefixes_every_route_and_its_token_stays_out_of_its_repr(url):
    client = ServiceConnection(f"{url}/chunkpilot/", 2.0, {"authorization": "Bearer s3cret"})
    assert said(client.post("/v1/feedback", b"{}"))["path"] == "/chunkpilot/v1/feedback"
    assert "s3cret" not in repr(client)


def test_concurrent_callers_each_get_a_connection(url):
    client = ServiceConnection(url, 2.0)
    with ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(lambda i: said(client.post("/x", str(i).encode()))["body"], range(40)))
    assert bodies == [str(i) for i in range(40)]


def test_every_failure_says_what_happened(url):
    client = ServiceConnection(url, 0.2)
    with pytest.raises(TimedOut, match="no answer within 200 ms"):
        client.get("/slow")
    with pytest.raises(StatusError) as refused:
        client.get("/refuse")
    assert refused.value.status == 422 and refused.value.detail.startswith("memory_budget_mb: ")
    with pytest.raises(StatusError, match="HTTP 307: elsewhere"):  # not followed: the service never redirects
        client.get("/moved")
    assert said(client.get("/after"))["path"] == "/after"  # the timed-out connection is not reused
    with pytest.raises(Unreachable, match="refused"):
        ServiceConnection(f"http://127.0.0.1:{free_port()}", 0.2).get("/v1/model")
    for wrong in ("ftp://127.0.0.1:1", "http://user:pw@127.0.0.1:1", "http://127.0.0.1:1/?q=1"):
        with pytest.raises(ValueError, match="http"):
            ServiceConnection(wrong, 0.2)
