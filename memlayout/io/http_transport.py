"""HTTP(S) for every remote read of one run: one aiohttp session, one connection pool, one event loop.

A run that reads a thousand repositories opens one `HttpTransport`: its event loop
runs in a thread of its own, and the threads that load sources hand it their
requests (`fetch`), so that requests of many sources are in flight together over
a bounded pool of connections (`connections`). fsspec's HTTP filesystem is not
used here: one per source leaked its session and ten descriptors (fsspec's
finalizer held the session, whose trace config held the filesystem), and it hides
the statuses and headers that say what a server did.

What each request does, whatever asked for it:
- it is bounded by the run's timeout, redirects and retries included: an
  answer of 429 or 5xx, or a connection the server dropped, is tried again (at
  most `MAX_ATTEMPTS` times, after 0.1 s, then 0.2 s) only while time is left;
- redirects are followed by hand: one to another scheme is refused, more than
  `MAX_REDIRECTS` is a loop, a token (Authorization) never leaves the origin it
  was meant for, and where a URL led (the Hub's `resolve` URL to its CDN) is kept,
  so its later ranges go there directly; a kept target that answers 403, 404 or
  410 (a signed URL that expired) is resolved again;
- a Range request answered 200 is the server sending the whole file: the reply is
  dropped before its body is read (`RangeNotSupportedError`);
- several ranges of one file go in one request (`multipart/byteranges`, RFC 9110
  14.6) where the server answers so; a server that answers otherwise is asked
  one range a request from then on.

Nothing here knows about tensors, and nothing is executed: bytes are only bytes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDictProxy
from yarl import URL

from memlayout.errors import RangeNotSupportedError, RemoteReadError
from memlayout.io.remote_watch import AUTH_HINT, RUN_ENDED, Watch

MAX_REDIRECTS = 10
MAX_ATTEMPTS = 3
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_WAIT_S = 0.1
MAX_RANGES_PER_REQUEST = 64
"""Spans in one Range header: 64 of them stay well inside the 8 KiB header limit of common servers."""
MERGE_GAP = 96
"""Spans of one file closer than this are asked as one: a part of a multipart reply costs about 100 bytes."""
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_EXPIRED = frozenset({403, 404, 410})


class Want(NamedTuple):
    """One read: bytes `start .. end` of `url`; `end` None for the whole file, `start` < 0 for its last -start bytes."""

    url: str
    start: int
    end: int | None


class Reply(NamedTuple):
    """A server's answer that is no error: its status, headers, body and where it came from."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    url: str
    """The URL that answered (after redirects)."""


class _Retry(Exception):
    """A failure worth another try while time is left (a 429 or 5xx, a dropped connection)."""

    def __init__(self, error: RemoteReadError, wait: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.wait = wait


class _Expired(Exception):
    """A kept redirect target refused the request: resolve the original URL again."""


def _request_headers(url: str, target: str, headers: dict[str, str], range_value: str | None) -> dict[str, str]:
    """The headers of one request for `url` at `target`: no Authorization to another origin (a redirect's), and a
    Range read as the bytes stored (identity), never decompressed."""
    send = dict(headers) if _origin(target) == _origin(url) else {
        k: v for k, v in headers.items() if k.lower() != "authorization"
    }
    if range_value is not None:
        send["Range"] = range_value
        send["Accept-Encoding"] = "identity"
    return send


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def status_error(url: str, status: int, reason: str) -> RemoteReadError:
    """One line for an HTTP error status."""
    if status == 404:
        return RemoteReadError(f"{url}: not found (HTTP 404)", f"check the URL; {AUTH_HINT}")
    if status in (401, 403):
        word = "unauthorized" if status == 401 else "forbidden"
        return RemoteReadError(f"{url}: access refused (HTTP {status} {word})", AUTH_HINT)
    return RemoteReadError(f"{url}: the server answered HTTP {status} {reason}".rstrip())


def html_page_error(url: str) -> RemoteReadError:
    """A URL that answers with a web page (a folder's listing, a login page) names no checkpoint file."""
    return RemoteReadError(
        f"{url}: the server answered with an HTML page (a folder listing?), not a checkpoint",
        "give the URL of the checkpoint file, of the model folder's config.json, or of the folder ending in /",
    )


class HttpTransport:
    """One aiohttp session and its event loop, for every HTTP(S) read of a run; `close` ends both.

    Args:
        timeout_s: Bound on each request, its redirects and retries included.
        connections: Connections open at once, over every host (each is a descriptor).
    """

    def __init__(self, timeout_s: float, connections: int) -> None:
        self.timeout_s = timeout_s
        self._redirects: dict[str, str] = {}
        self._single_range: set[tuple[str, str, int | None]] = set()
        self._closing = threading.Lock()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="memlayout-http", daemon=True)
        self._thread.start()
        self._slots: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession = self._run(self._open(connections))

    async def _open(self, connections: int) -> aiohttp.ClientSession:
        # The wait for a free connection is not the server's time: requests queue on
        # this semaphore, and each one's deadline starts once it holds a slot.
        self._slots = asyncio.Semaphore(connections)
        connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, ttl_dns_cache=300)
        return aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), cookie_jar=aiohttp.DummyCookieJar(),
        )

    def _run(self, coroutine: Any) -> Any:
        with self._closing:
            if self._closed:
                coroutine.close()
                raise RemoteReadError(RUN_ENDED)
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    def close(self) -> None:
        """Close every connection and stop the loop; safe to call more than once, from any thread.

        Reads still in flight (other paths' threads, when the run is interrupted)
        are cancelled, so that no thread waits on a loop that has stopped.
        """
        with self._closing:
            if self._closed:
                return
            self._closed = True
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        done.result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _shutdown(self) -> None:
        this = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not this]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._session.close()

    # -- what the loaders call -----------------------------------------------------

    def fetch(self, wants: Sequence[Want], headers: dict[str, str], watch: Watch) -> list[bytes | BaseException]:
        """Every want's bytes, or its error, in the order asked; all in flight together.

        Several ranges of one URL go in one request where the server allows it.
        """
        return list(self._run(self._fetch_all(list(wants), headers, watch)))

    def get(self, url: str, headers: dict[str, str], watch: Watch) -> Reply:
        """A whole document (a Hub API answer) of any status below 500, for the caller to read; errors raise."""
        reply: Reply = self._run(self._request(url, None, headers, watch, accept_errors=True))
        return reply

    # -- requests ------------------------------------------------------------------

    async def _fetch_all(self, wants: list[Want], headers: dict[str, str], watch: Watch) -> list[Any]:
        by_url: dict[str, list[int]] = {}
        for index, want in enumerate(wants):
            if want.end is not None or want.start < 0:
                by_url.setdefault(want.url, []).append(index)
        results: list[Any] = [None] * len(wants)
        jobs = []
        for index, want in enumerate(wants):
            if want.end is None and want.start >= 0:
                jobs.append(self._whole(index, want, headers, watch, results))
        for url, indexes in by_url.items():
            jobs.append(self._ranges(url, [wants[i] for i in indexes], indexes, headers, watch, results))
        await asyncio.gather(*jobs)
        return results

    async def _whole(self, index: int, want: Want, headers: dict[str, str], watch: Watch, out: list[Any]) -> None:
        try:
            reply = await self._request(want.url, None, headers, watch)
            out[index] = reply.body
        except Exception as exc:  # each want's own error; the others go on
            out[index] = exc

    async def _ranges(
        self, url: str, wants: list[Want], indexes: list[int], headers: dict[str, str], watch: Watch, out: list[Any],
    ) -> None:
        spans = _merged([(w.start, w.end) for w in wants])
        pieces: dict[tuple[int, int | None], bytes] = {}
        try:
            if len(spans) > 1 and _origin(self._redirects.get(url, url)) not in self._single_range:
                for chunk in range(0, len(spans), MAX_RANGES_PER_REQUEST):
                    pieces.update(await self._multi(url, spans[chunk : chunk + MAX_RANGES_PER_REQUEST], headers, watch))
            missing = [span for span in spans if span not in pieces]
            answers = await asyncio.gather(
                *(self._one_range(url, span, headers, watch) for span in missing), return_exceptions=True
            )
            for span, answer in zip(missing, answers, strict=True):
                if isinstance(answer, BaseException):
                    raise answer
                pieces[span] = answer
        except Exception as exc:
            for index in indexes:
                out[index] = exc
            return
        for index, want in zip(indexes, wants, strict=True):
            out[index] = _cut(pieces, want, watch.size_of(url))

    async def _one_range(self, url: str, span: tuple[int, int | None], headers: dict[str, str], watch: Watch) -> bytes:
        reply = await self._request(url, _range_value([span]), headers, watch)
        return reply.body

    async def _multi(
        self, url: str, spans: list[tuple[int, int | None]], headers: dict[str, str], watch: Watch,
    ) -> dict[tuple[int, int | None], bytes]:
        """The spans one multipart reply holds; an empty answer where the server would not send one."""
        try:
            reply = await self._request(url, _range_value(spans), headers, watch, whole_is_refusal=False)
        except RangeNotSupportedError:
            return {}
        if reply.status != 206:  # a whole file, dropped unread: ask range by range
            self._single_range.add(_origin(reply.url))
            return {}
        parts = _parts(reply.headers.get("Content-Type", ""), reply.headers, reply.body, url)
        size = next((total for _, _, total in parts if total is not None), watch.size_of(url))
        if size is not None:
            watch.tally.sizes[url] = size
        found: dict[tuple[int, int | None], bytes] = {}
        for start, end in spans:
            if size is None:
                continue
            begin, stop = (max(0, size + start), size) if start < 0 else (start, min(end or size, size))
            for part_start, data, _ in parts:
                if part_start <= begin and part_start + len(data) >= stop:
                    found[(start, end)] = data[begin - part_start : stop - part_start]
                    break
        if len(found) < len(spans):
            self._single_range.add(_origin(reply.url))
        return found

    async def _request(
        self, url: str, range_value: str | None, headers: dict[str, str], watch: Watch,
        accept_errors: bool = False, whole_is_refusal: bool = True,
    ) -> Reply:
        assert self._slots is not None
        async with self._slots:
            deadline = self._loop.time() + self.timeout_s
            attempt = 0
            while True:
                attempt += 1
                try:
                    return await self._follow(url, range_value, headers, watch, deadline, accept_errors,
                                              whole_is_refusal)
                except _Expired:
                    self._redirects.pop(url, None)
                except _Retry as retry:
                    wait = retry.wait if retry.wait is not None else RETRY_WAIT_S * 2 ** (attempt - 1)
                    if attempt >= MAX_ATTEMPTS or self._loop.time() + wait >= deadline:
                        raise retry.error from None
                    await asyncio.sleep(wait)

    async def _follow(
        self, url: str, range_value: str | None, headers: dict[str, str], watch: Watch, deadline: float,
        accept_errors: bool, whole_is_refusal: bool,
    ) -> Reply:
        target = self._redirects.get(url, url)
        kept = target != url
        for _ in range(MAX_REDIRECTS + 1):
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise self._timeout(url)
            send = _request_headers(url, target, headers, range_value)
            try:
                async with self._session.get(
                    target, headers=send, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=remaining),
                ) as response:
                    watch.tally.requests += 1
                    status = response.status
                    location = response.headers.get("Location")
                    if status in _REDIRECTS and location:
                        target = self._redirect(url, response.url, location)
                        continue
                    if status in RETRY_STATUSES:
                        after = response.headers.get("Retry-After", "")
                        raise _Retry(status_error(url, status, response.reason or ""),
                                     float(after) if after.isdigit() else None)
                    if kept and status in _EXPIRED:
                        raise _Expired
                    if status >= 400 and not accept_errors:
                        raise status_error(url, status, response.reason or "")
                    if range_value is not None and status == 200:
                        response.close()  # the body is the whole file: never read it
                        if response.content_type == "text/html":
                            raise html_page_error(url)
                        if whole_is_refusal:
                            raise RangeNotSupportedError(url, response.content_length)
                        return Reply(status, response.headers, b"", str(response.url))
                    body = await response.read()
            except (RemoteReadError, _Retry, _Expired):
                raise
            except asyncio.TimeoutError:
                raise self._timeout(url) from None
            except aiohttp.ClientPayloadError:
                raise RemoteReadError(
                    f"{url}: the reply ended before the bytes it announced (a truncated body)",
                    "run the command again; if it persists, the server or a proxy cuts replies short",
                ) from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                raise _Retry(
                    RemoteReadError(f"{url}: cannot connect ({exc})", "check the address and the network")
                ) from None
            except aiohttp.ClientError as exc:
                raise RemoteReadError(f"{url}: cannot be read ({type(exc).__name__}: {exc})") from None
            watch.tally.bytes_fetched += len(body)
            watch.saw(url, status, response.headers)
            if target != url:
                self._redirects[url] = target
            return Reply(status, response.headers, body, target)
        raise RemoteReadError(f"{url}: more than {MAX_REDIRECTS} redirects (a redirect loop?)",
                              "check the URL with the server")

    def _redirect(self, url: str, here: URL, location: str) -> str:
        target = here.join(URL(location))
        if target.scheme != here.scheme:
            raise RemoteReadError(
                f"{url}: the server redirects to {target.scheme}:// ({target.human_repr()}), "
                "and memlayout follows no redirect to another scheme",
                "use the final URL if you trust it",
            )
        return str(target)

    def _timeout(self, url: str) -> RemoteReadError:
        return RemoteReadError(
            f"{url}: no complete reply within {self.timeout_s:g} s (a timeout)",
            "retry, or allow longer with --timeout SECONDS",
        )


def _merged(spans: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    """Spans sorted, with those that overlap or lie within MERGE_GAP of each other joined; suffixes kept apart."""
    ordinary = sorted((s, e) for s, e in spans if s >= 0 and e is not None)
    merged: list[list[int]] = []
    for start, end in ordinary:
        if merged and start <= merged[-1][1] + MERGE_GAP:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    suffixes = sorted({(s, e) for s, e in spans if s < 0})
    return [(s, e) for s, e in merged] + suffixes


def _range_value(spans: list[tuple[int, int | None]]) -> str:
    return "bytes=" + ",".join(f"{s}-{e - 1}" if s >= 0 and e is not None else f"-{-s}" for s, e in spans)


def _cut(pieces: dict[tuple[int, int | None], bytes], want: Want, size: int | None) -> bytes:
    """The wanted bytes out of the merged span that holds them."""
    if want.start < 0:
        return pieces[(want.start, want.end)]
    assert want.end is not None
    for (start, end), data in pieces.items():
        if 0 <= start <= want.start and end is not None and want.end <= end:
            return data[want.start - start : want.end - start]
    raise KeyError(want)  # pragma: no cover - every want lies in one merged span


def _content_range(value: str) -> tuple[int, int, int | None] | None:
    """(first, last, total) of a Content-Range value ("bytes 0-63/1000"); total None for "*"."""
    span, _, total = value.strip().removeprefix("bytes ").partition("/")
    first, _, last = span.partition("-")
    if not (first.isdigit() and last.isdigit()):
        return None
    return int(first), int(last), int(total) if total.isdigit() else None


def _parts(content_type: str, headers: Any, body: bytes, url: str) -> list[tuple[int, bytes, int | None]]:
    """(start, bytes, file size) of each part of a 206 reply: one part, or a multipart/byteranges body."""
    if not content_type.startswith("multipart/byteranges"):
        single = _content_range(headers.get("Content-Range", ""))
        return [] if single is None else [(single[0], body, single[2])]
    boundary = content_type.partition("boundary=")[2].split(";")[0].strip().strip('"').encode()
    delimiter = b"--" + boundary
    parts = []
    at = body.find(delimiter)
    while at >= 0:
        at += len(delimiter)
        if body[at : at + 2] == b"--":
            break
        head_end = body.find(b"\r\n\r\n", at)
        if head_end < 0:
            break
        span = None
        for line in body[at:head_end].decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-range":
                span = _content_range(value)
        if span is None:
            raise RemoteReadError(f"{url}: a multipart reply has a part without its byte range (a damaged reply)")
        start = head_end + 4
        data = body[start : start + span[1] - span[0] + 1]
        parts.append((span[0], data, span[2]))
        at = body.find(delimiter, start + len(data))
    return parts
