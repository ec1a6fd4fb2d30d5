"""A fake Hugging Face Hub on 127.0.0.1, for bench_hub_audit.py and the tests that audit many repositories.

It answers the endpoints huggingface_hub and memlayout call, as the Hub answers them:

| request | answer |
|---|---|
| `GET /api/models/ORG/NAME/tree/REV[/PATH]` | the listing as JSON (`type`, `oid`, `size`, `path`, and `lfs` for weights), paged by `Link: <...>; rel="next"` past `page_size` entries |
| `GET /api/models/ORG/NAME[/revision/REV]` | the repository's info: `id`, `sha`, `siblings` |
| `GET` or `HEAD /ORG/NAME/resolve/REV/PATH` | a small file (config, index) itself, with Range; a weights file (LFS) by a 302 to the second host, with `X-Linked-Size`, `X-Linked-Etag` and `X-Repo-Commit` as the Hub sends them |
| `GET` or `HEAD /lfs/KEY` on the second host (the "CDN") | the file, with single and multiple byte ranges (`multipart/byteranges`), suffix ranges and ETags |
| a missing repository, revision or file | 404 with the Hub's `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) |
| anything about a repository named in `silent` | the connection is accepted and never answered |

Every request waits `latency_s` before its answer (a cloud machine is about 50 ms
from the real Hub), and both hosts send with TCP_NODELAY (aiohttp's default,
set again here), so a small reply is not held back by Nagle's algorithm. The hub
counts what it answered: requests by kind and status, and body bytes sent.

The Hub and the CDN are two listeners of one aiohttp application, in a thread of
their own with their own event loop, so the process that measures a client is
not the one it measures.
"""  # noqa: E501  (a Markdown table: a row is one line)

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")
"""Files the Hub stores in LFS (and serves from its CDN), as a repository's .gitattributes would say."""
CDN_HOST = "127.0.0.2"
"""A second loopback address, so that the redirect leaves the Hub's origin as the real one does."""


@dataclass
class HubStats:
    """What the fake Hub answered since it started (or since `reset`)."""

    requests: Counter[str] = field(default_factory=Counter)
    """Requests by "KIND STATUS": api, resolve, cdn (each with its HTTP status)."""
    body_bytes: int = 0
    """Body bytes sent, on both hosts."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, status: int, body: int) -> None:
        with self.lock:
            self.requests[f"{kind} {status}"] += 1
            self.body_bytes += body

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.body_bytes = 0

    @property
    def total(self) -> int:
        with self.lock:
            return sum(self.requests.values())


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Repository:
    """One repository: a folder whose files (recursively) are the repository's, at revision `main`."""

    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id = repo_id
        self.folder = folder
        self.commit = _sha(f"commit:{repo_id}")[:40]
        self.files: dict[str, Path] = {}
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                self.files[path.relative_to(folder).as_posix()] = path

    def entry(self, name: str) -> dict[str, Any]:
        path = self.files[name]
        size = path.stat().st_size
        entry: dict[str, Any] = {"type": "file", "oid": _sha(f"blob:{self.repo_id}/{name}")[:40], "size": size,
                                 "path": name}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"oid": self.lfs_key(name), "size": size, "pointerSize": 134}
        return entry

    def lfs_key(self, name: str) -> str:
        # Files of identical content share one LFS object on the real Hub; here the key names the file,
        # as the benchmark's repositories share their bytes through hard links.
        return _sha(f"lfs:{self.repo_id}/{name}")


class _Answered(Exception):
    """An error answer, raised from deep in a handler and sent by `_answer_errors`."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


@web.middleware
async def _answer_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except _Answered as answered:
        return answered.response
    return response


class FakeHub:
    """The application: repositories by id, the latency, the silent ones, and the counters."""

    def __init__(self, repos: dict[str, Path], latency_s: float = 0.0, silent: frozenset[str] = frozenset(),
                 page_size: int = 1000) -> None:
        self.repos = {repo_id: _Repository(repo_id, folder) for repo_id, folder in repos.items()}
        self.latency_s = latency_s
        self.silent = silent
        self.page_size = page_size
        self.stats = HubStats()
        self.cdn_url = ""
        self._lfs: dict[str, Path] = {
            repo.lfs_key(name): path
            for repo in self.repos.values() for name, path in repo.files.items() if name.endswith(LFS_SUFFIXES)
        }

    def hub_app(self) -> web.Application:
        app = web.Application(middlewares=[_answer_errors])
        app.router.add_route("GET", r"/api/models/{org}/{name}/tree/{rev}{path:(/.*)?}", self.tree)
        app.router.add_route("GET", r"/api/models/{org}/{name}/revision/{rev}", self.info)
        app.router.add_route("GET", r"/api/models/{org}/{name}", self.info)
        app.router.add_route("*", r"/{org}/{name}/resolve/{rev}/{path:.+}", self.resolve)
        return app

    def cdn_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", r"/lfs/{key}", self.cdn)
        return app

    # -- the Hub's side -------------------------------------------------------------

    async def _repository(self, request: web.Request, kind: str) -> _Repository:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo_id in self.silent:
            await asyncio.sleep(3600)  # accepted, never answered
        await asyncio.sleep(self.latency_s)
        repo = self.repos.get(repo_id)
        if repo is None:
            raise self._error(kind, 404, "RepoNotFound", f"Repository Not Found for url: {request.url}.")
        rev = request.match_info.get("rev", "main")
        if rev not in ("main", repo.commit):
            raise self._error(kind, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return repo

    def _error(self, kind: str, status: int, code: str, message: str) -> _Answered:
        body = json.dumps({"error": message}).encode()
        self.stats.count(kind, status, len(body))
        return _Answered(web.Response(status=status, body=body, content_type="application/json",
                                      headers={"X-Error-Code": code, "X-Error-Message": message}))

    async def tree(self, request: web.Request) -> web.Response:
        repo = await self._repository(request, "api")
        prefix = request.match_info["path"].strip("/")
        names = [n for n in repo.files if not prefix or n.startswith(prefix + "/")]
        if request.query.get("recursive", "false").lower() not in ("true", "1"):
            depth = prefix.count("/") + 1 if prefix else 0
            names = [n for n in names if n.count("/") == depth]
        start = int(request.query.get("cursor", "0"))
        page = names[start:start + self.page_size]
        headers = {}
        if start + self.page_size < len(names):
            following = request.url.update_query({"cursor": str(start + self.page_size)})
            headers["Link"] = f'<{following}>; rel="next"'
        body = json.dumps([repo.entry(n) for n in page]).encode()
        self.stats.count("api", 200, len(body))
        return web.Response(body=body, headers=headers, content_type="application/json")

    async def info(self, request: web.Request) -> web.Response:
        repo = await self._repository(request, "api")
        body = json.dumps({"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit, "private": False,
                           "siblings": [{"rfilename": n} for n in repo.files]}).encode()
        self.stats.count("api", 200, len(body))
        return web.Response(body=body, content_type="application/json")

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        repo = await self._repository(request, "resolve")
        name = request.match_info["path"]
        if name not in repo.files:
            raise self._error("resolve", 404, "EntryNotFound", f"{name} does not exist on \"main\"")
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if name.endswith(LFS_SUFFIXES):
            entry = repo.entry(name)
            signed = f"{self.cdn_url}/lfs/{entry['lfs']['oid']}?X-Amz-Signature={_sha(name)[:16]}&X-Amz-Expires=3600"
            headers.update({"Location": signed, "X-Linked-Size": str(entry["size"]),
                            "X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "ETag": f'W/"{entry["oid"]}"'})
            self.stats.count("resolve", 302, 0)
            return web.Response(status=302, headers=headers)
        return self._file(request, repo.files[name], "resolve", headers, etag=repo.entry(name)["oid"])

    # -- the CDN's side -------------------------------------------------------------

    async def cdn(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(self.latency_s)
        path = self._lfs.get(request.match_info["key"])
        if path is None:
            self.stats.count("cdn", 404, 0)
            return web.Response(status=404)
        return self._file(request, path, "cdn", {"Accept-Ranges": "bytes"}, etag=request.match_info["key"])

    def _file(self, request: web.Request, path: Path, kind: str, headers: dict[str, str],
              etag: str) -> web.Response:
        size = path.stat().st_size
        headers = {**headers, "ETag": f'"{etag}"'}
        spans = _ranges(request.headers.get("Range"), size)
        if spans is None:  # no Range: the whole file
            body = b"" if request.method == "HEAD" else path.read_bytes()
            self.stats.count(kind, 200, len(body))
            return web.Response(body=body, headers={**headers, "Content-Length": str(size)})
        if not spans:
            self.stats.count(kind, 416, 0)
            return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{size}"})
        with open(path, "rb") as handle:
            parts = [(start, os.pread(handle.fileno(), end - start, start)) for start, end in spans]
        if len(parts) == 1:
            start, data = parts[0]
            headers["Content-Range"] = f"bytes {start}-{start + len(data) - 1}/{size}"
            body = data
            content_type = "application/octet-stream"
        else:
            boundary = "fakehubboundary"
            pieces = []
            for start, data in parts:
                pieces.append(f"--{boundary}\r\nContent-Type: application/octet-stream\r\n"
                              f"Content-Range: bytes {start}-{start + len(data) - 1}/{size}\r\n\r\n".encode())
                pieces += [data, b"\r\n"]
            pieces.append(f"--{boundary}--\r\n".encode())
            body = b"".join(pieces)
            content_type = f"multipart/byteranges; boundary={boundary}"
        if request.method == "HEAD":
            body = b""
        self.stats.count(kind, 206, len(body))
        return web.Response(status=206, body=body, headers={**headers, "Content-Type": content_type})


def _ranges(header: str | None, size: int) -> list[tuple[int, int]] | None:
    """A Range header's spans as (start, end) within a file of `size`; None without one, [] when none is satisfiable."""
    if not header or not header.startswith("bytes="):
        return None
    spans = []
    for part in header[len("bytes="):].split(","):
        first, _, last = part.strip().partition("-")
        if not first:  # a suffix: the last N bytes
            start, end = max(0, size - int(last)), size
        else:
            start, end = int(first), min(size, int(last) + 1) if last else size
        if start < end:
            spans.append((start, end))
    return spans


class RunningHub:
    """A started fake Hub: its endpoint (HF_ENDPOINT), its counters, and the environment that points at it."""

    def __init__(self, hub: FakeHub, endpoint: str) -> None:
        self.hub = hub
        self.endpoint = endpoint
        self.stats = hub.stats

    def environment(self) -> dict[str, str]:
        """What a client needs to read this Hub: its address, no token, no telemetry."""
        return {"HF_ENDPOINT": self.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_TOKEN": ""}


def _listening_socket(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


@contextlib.contextmanager
def running_fake_hub(repos: dict[str, Path], latency_s: float = 0.0, silent: frozenset[str] = frozenset(),
                     page_size: int = 1000) -> Iterator[RunningHub]:
    """The fake Hub serving `repos` (repository id -> folder) until the block ends.

    Args:
        repos: Each repository's files, as a folder.
        latency_s: Seconds every request waits before its answer.
        silent: Repository ids whose requests are accepted and never answered.
        page_size: Entries per page of a tree listing.
    """
    hub = FakeHub(repos, latency_s, silent, page_size)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runners: list[web.AppRunner] = []
    sockets = {"hub": _listening_socket("127.0.0.1"), "cdn": _listening_socket(CDN_HOST)}
    hub.cdn_url = f"http://{CDN_HOST}:{sockets['cdn'].getsockname()[1]}"

    async def start() -> None:
        for name, app in (("hub", hub.hub_app()), ("cdn", hub.cdn_app())):
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
            await runner.setup()
            await web.SockSite(runner, sockets[name]).start()
            runners.append(runner)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="fake-hub", daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield RunningHub(hub, f"http://127.0.0.1:{sockets['hub'].getsockname()[1]}")
    finally:
        async def stop() -> None:
            for runner in runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        for sock in sockets.values():
            sock.close()
