"""A real HTTP server for the remote-read tests: Debian's nginx on 127.0.0.1, with a config of its own.

Each test session starts one nginx in the foreground (`daemon off`) on a free port,
its pid file, logs and temporary folders in pytest's tmp, serving one folder
(`root`). The locations cover what a remote read meets:

| location | what it does |
|---|---|
| `/files/` | the folder, with Range support (nginx's default) |
| `/redirect/` | a 302 to `/files/`, as the Hub's `resolve` URLs redirect to its CDN |
| `/norange/` | the folder with Range switched off (`max_ranges 0`): 200 and the whole file |
| `/onerange/` | the folder with one range a request (`max_ranges 1`): several ranges in one request get 200 and the whole file |
| `/listing/` | the folder with nginx's HTML listing of a folder (`autoindex on`) |
| `/forbidden/`, `/unauthorized/` | 403, 401 |
| `/loop/` | a 302 to itself, forever |
| `/to-https/` | a 302 to https://, another scheme |
| `/slow/` | the folder at 1 byte per second (`limit_rate 1`) |
| `/etag-changes/` | the folder, with a new ETag on every reply (the file "changes" between requests) |
| `/truncated/` | a proxy to an upstream that announces more bytes than it sends |
| `/api/models/`, `/ORG/NAME/resolve/REV/PATH` | the Hub's layout (`HF_ENDPOINT` points here): the tree listing as static JSON, and `resolve` redirecting (302) to the file |

The tests skip with one line where nginx is not installed: `make test` installs it
where apt-get can, as it installs chromium.
"""  # noqa: E501  (a Markdown table: a row is one line)

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

NGINX = os.environ.get("MEMLAYOUT_NGINX", "/usr/sbin/nginx")


class LoggedRequest(NamedTuple):
    """One line of the access log: what nginx itself says it sent."""

    uri: str
    status: int
    range: str
    """The request's Range header, "-" for none."""
    body_bytes: int


class Server(NamedTuple):
    """A running nginx: where it listens and what it serves."""

    url: str
    """http://127.0.0.1:PORT, without a trailing slash."""
    root: Path
    """The folder served: files under root/"files", the Hub's layout under root/"hub" and root/"api"."""
    access_log: Path

    def requests_since(self, mark: int) -> list[LoggedRequest]:
        """The requests logged after `mark` (a `log_mark()`)."""
        lines = self.access_log.read_bytes()[mark:].decode().splitlines()
        out = []
        for line in lines:
            uri, status, rest = line.split(" ", 2)
            wanted, _, sent = rest.rpartition(" ")
            out.append(LoggedRequest(uri, int(status), wanted.strip('"'), int(sent)))
        return out

    def log_mark(self) -> int:
        """Where the access log ends now (nginx writes each line when its request ends)."""
        return self.access_log.stat().st_size if self.access_log.exists() else 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _truncating_upstream(stop: threading.Event) -> int:
    """A one-line upstream: every reply announces 1000 bytes, sends 10, and closes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            with connection:
                connection.recv(65536)
                connection.sendall(
                    b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\n"
                    b"Content-Range: bytes 0-999/5000\r\nConnection: close\r\n\r\n" + b"x" * 10
                )
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(server.getsockname()[1])


def config(port: int, root: Path, state: Path, upstream: int) -> str:
    files = root / "files"
    # One process, no master and no workers: killing it leaves nothing behind (a master
    # killed with SIGKILL would orphan its workers), and it reads pytest's 0700 tmp as
    # the user who started it.
    return f"""
master_process off;
daemon off;
pid {state}/nginx.pid;
error_log {state}/error.log;
events {{ worker_connections 256; }}
http {{
    log_format ranges '$request_uri $status "$http_range" $body_bytes_sent';
    access_log {state}/access.log ranges;
    client_body_temp_path {state}/body;
    proxy_temp_path {state}/proxy;
    fastcgi_temp_path {state}/fastcgi;
    uwsgi_temp_path {state}/uwsgi;
    scgi_temp_path {state}/scgi;
    default_type application/octet-stream;
    keepalive_requests 10000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location /files/ {{ }}
        location /redirect/ {{ rewrite ^/redirect/(.*)$ /files/$1 redirect; }}
        location /norange/ {{ alias {files}/; max_ranges 0; }}
        location /onerange/ {{ alias {files}/; max_ranges 1; }}
        location /listing/ {{ alias {files}/; autoindex on; }}
        location /forbidden/ {{ return 403; }}
        location /unauthorized/ {{ return 401; }}
        location /loop/ {{ return 302 $uri; }}
        location /to-https/ {{ return 302 https://127.0.0.1:{port}/files/; }}
        location /slow/ {{ alias {files}/; limit_rate 1; }}
        location /etag-changes/ {{ alias {files}/; etag off; add_header ETag "\\"$request_id\\"" always; }}
        location /truncated/ {{ proxy_pass http://127.0.0.1:{upstream}; proxy_buffering off; }}
        location /api/models/ {{ default_type application/json; }}
        location ~ ^/([^/]+)/([^/]+)/resolve/([^/]+)/(.*)$ {{ return 302 /hub/$1/$2/$3/$4; }}
        location /hub/ {{ }}
    }}
}}
"""


class NginxMissing(RuntimeError):
    """nginx is not installed here."""


def nginx_binary() -> str:
    """The nginx executable.

    Raises:
        NginxMissing: none is installed.
    """
    if os.access(NGINX, os.X_OK):
        return NGINX
    found = shutil.which("nginx")
    if found is None:
        raise NginxMissing(f"nginx is not installed at {NGINX} (make test installs it where apt-get can)")
    return found


@contextlib.contextmanager
def running_nginx(tmp: Path) -> Iterator[Server]:
    """nginx serving tmp/"root" in the foreground until the block ends; for the tests and the benchmark.

    Raises:
        NginxMissing: nginx is not installed.
        RuntimeError: it did not start (its error line says why).
    """
    binary = nginx_binary()
    root, state = tmp / "root", tmp / "state"
    (root / "files").mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    upstream = _truncating_upstream(stop)
    port = free_port()
    conf = state / "nginx.conf"
    conf.write_text(config(port, root, state, upstream))
    process = subprocess.Popen(
        [binary, "-p", str(state), "-e", str(state / "error.log"), "-c", str(conf)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    error = process.stderr.read().decode() if process.stderr else ""
                    raise RuntimeError(f"nginx did not start: {error.strip()}") from None
                time.sleep(0.05)
        yield Server(f"http://127.0.0.1:{port}", root, state / "access.log")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        stop.set()


def start_nginx(tmp: Path) -> Iterator[Server]:
    """The pytest fixture's body: a running nginx, or one skip line where it is not installed."""
    try:
        nginx_binary()
    except NginxMissing as exc:
        pytest.skip(str(exc))
    with running_nginx(tmp) as server:
        yield server
