"""Byte ranges of files behind URLs, through fsspec: no HTTP client of memlayout's own.

Inspecting a checkpoint needs its metadata, not its tensors: a safetensors header,
a zip's directory and pickle. So a remote file is read as a few byte ranges, and
every range of one step is fetched concurrently (`RemoteFiles.read_ranges`: one
request per shard header of a sharded model, all in flight at once).

HTTP(S) goes through fsspec's `HTTPFileSystem` (aiohttp underneath). aiohttp's
request tracing is where memlayout watches each exchange, because fsspec's
`cat_file` neither shows the status nor the headers:
- a 200 answer to a Range request means the server ignores Range and is sending
  the whole file: the request is stopped before its body is read, and the read is
  refused unless the caller allowed a full download;
- a redirect to another scheme (https -> http, or the reverse) is refused;
- an ETag that changes between two requests for one URL means the file was
  replaced between them, and ranges of two different files are no file at all.
Any other fsspec filesystem (s3://, gs://, ...) is used as the user installed it;
there, the requests and bytes are counted as the ranges asked for.

Nothing here knows about tensors, and nothing is executed: bytes are only bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memlayout.errors import RangeNotSupportedError, RemoteReadError

DEFAULT_TIMEOUT_S = 30.0
MAX_REDIRECTS = 10
AUTH_HINT = (
    "a private or gated Hugging Face repository needs a token: set the HF_TOKEN environment variable "
    "(memlayout sends it only to the Hub's endpoint)"
)


@dataclass
class Tally:
    """What the reads of one source cost, over every file they touched."""

    requests: int = 0
    """HTTP requests sent, redirects included (or ranges asked for, on other filesystems)."""
    bytes_fetched: int = 0
    """Response body bytes received."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Each file's full size, by URL, as the server reported it."""


def start_importing_transport() -> None:
    """Import fsspec's HTTP filesystem and aiohttp in a background thread, for a command about to read a URL.

    Importing aiohttp builds its TLS contexts (loading the system's CA
    certificates), which with fsspec costs about as much as the rest of an
    inspect's start. OpenSSL loads them without the GIL, and the command's own
    imports (rules, reports) go on meanwhile, so a CLI that sees a URL among its
    paths calls this first. A failed import here is ignored: `RemoteFiles` imports
    again and reports it.
    """
    import contextlib
    import threading

    def run() -> None:
        with contextlib.suppress(ImportError):
            import fsspec.implementations.http  # noqa: F401

    threading.Thread(target=run, name="memlayout-import-transport", daemon=True).start()


def _missing_extra(what: str) -> RemoteReadError:
    return RemoteReadError(
        f"reading {what} needs fsspec and aiohttp, which are not installed",
        "install them with: pip install 'memlayout[remote]'",
    )


class RemoteFiles:
    """Reads byte ranges of remote files; one instance per loaded source, so its tally is that source's.

    Args:
        protocol: The URL scheme ("https", "http", "s3", "gs", ...).
        timeout_s: Bound on each request, connection and body together.
        headers: Sent with every HTTP request (an Authorization header for the Hub).
        download: Allow reading a file whole when its server ignores Range requests.
    """

    def __init__(
        self, protocol: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, headers: dict[str, str] | None = None,
        download: bool = False,
    ) -> None:
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.download = download
        self.tally = Tally()
        self._etags: dict[str, str] = {}
        self._whole: dict[str, bytes] = {}
        self._http = protocol in ("http", "https")
        try:
            import fsspec

            if self._http:
                import aiohttp  # noqa: F401  (fsspec's HTTP filesystem needs it; say so before any request)
        except ImportError:
            raise _missing_extra(f"{protocol}:// URLs") from None
        if self._http:
            self.fs: Any = fsspec.filesystem(
                "http", skip_instance_cache=True, client_kwargs=self._client_kwargs(),
                headers=dict(headers or {}), max_redirects=MAX_REDIRECTS,
            )
        else:
            try:
                self.fs = fsspec.filesystem(protocol, skip_instance_cache=True)
            except (ImportError, ValueError) as exc:
                raise RemoteReadError(
                    f"{protocol}:// URLs need an fsspec filesystem for {protocol}, which is not installed ({exc})",
                    f"install it (s3fs for s3://, gcsfs for gs://) or download the file; memlayout reads "
                    f"{protocol}:// through fsspec",
                ) from None

    # -- HTTP watching -------------------------------------------------------------

    def _client_kwargs(self) -> dict[str, Any]:
        import aiohttp

        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(self._on_start)
        trace.on_request_redirect.append(self._on_redirect)
        trace.on_request_end.append(self._on_end)
        trace.on_response_chunk_received.append(self._on_chunk)
        return {"trace_configs": [trace], "timeout": aiohttp.ClientTimeout(total=self.timeout_s)}

    async def _on_start(self, session: Any, context: Any, params: Any) -> None:
        self.tally.requests += 1
        context.url = str(params.url)
        context.scheme = params.url.scheme

    async def _on_redirect(self, session: Any, context: Any, params: Any) -> None:
        location = params.response.headers.get("Location", "")
        target = params.url.join(type(params.url)(location))
        if target.scheme != context.scheme:
            raise RemoteReadError(
                f"{context.url}: the server redirects to {target.scheme}:// ({target.human_repr()}), "
                "and memlayout follows no redirect to another scheme",
                "use the final URL if you trust it",
            )
        self.tally.requests += 1  # the next hop is one more request

    async def _on_end(self, session: Any, context: Any, params: Any) -> None:
        response = params.response
        if "Range" in params.headers and response.status == 200:
            length = response.headers.get("Content-Length")
            raise RangeNotSupportedError(context.url, int(length) if length and length.isdigit() else None)
        if response.status == 206:
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            if total.isdigit():
                self.tally.sizes[context.url] = int(total)
        etag = response.headers.get("ETag")
        if etag and response.status in (200, 206):
            seen = self._etags.setdefault(context.url, etag)
            if seen != etag:
                raise RemoteReadError(
                    f"{context.url} changed while it was being read (ETag {seen} became {etag})",
                    "run the command again once the upload is finished",
                )

    async def _on_chunk(self, session: Any, context: Any, params: Any) -> None:
        self.tally.bytes_fetched += len(params.chunk)

    # -- reads ---------------------------------------------------------------------

    def read(self, url: str, start: int, end: int) -> bytes:
        """Bytes `start .. end` of the file at `url` (fewer only past its end)."""
        return self.read_ranges([(url, start, end)])[0]

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Several (url, start, end) ranges, fetched concurrently, in the order asked.

        Raises:
            RemoteReadError: the first range that failed, as one line with a hint.
        """
        wanted = [(url, start, end) for url, start, end in ranges if url not in self._whole and end > start]
        fetched: dict[tuple[str, int, int], bytes] = {}
        if wanted:
            results = self._fetch(wanted)
            failures = [(r, out) for r, out in zip(wanted, results, strict=True) if isinstance(out, BaseException)]
            if failures:
                (url, start, end), error = failures[0]
                if isinstance(error, RangeNotSupportedError) and self.download:
                    self._download(url)
                    return self.read_ranges(ranges)
                raise self._explain(url, error)
            for r, out in zip(wanted, results, strict=True):
                if len(out) != min(r[2], self.tally.sizes.get(r[0], r[2])) - r[1]:
                    raise RemoteReadError(
                        f"{r[0]}: asked for bytes {r[1]}..{r[2]} and got {len(out)} (a truncated reply)",
                        "run the command again; if it persists, the server or a proxy cuts replies short",
                    )
                fetched[r] = out
        out_list = []
        for url, start, end in ranges:
            whole = self._whole.get(url)
            if whole is not None:
                out_list.append(whole[start:end])
            else:
                out_list.append(fetched.get((url, start, end), b""))
        return out_list

    def read_whole(self, url: str) -> bytes:
        """A small file in full (an index or config.json), in one request."""
        if url not in self._whole:
            self._download(url)
        return self._whole[url]

    def size(self, url: str) -> int:
        """The file's full size, from a ranged reply already received or one metadata request."""
        known = self.tally.sizes.get(url)
        if known is not None:
            return known
        if url in self._whole:
            return len(self._whole[url])
        try:
            size = int(self.fs.size(url))
        except Exception as exc:  # fsspec's and the filesystems' errors vary; each gets one line
            raise self._explain(url, exc) from None
        self.tally.sizes[url] = size
        if not self._http:
            self.tally.requests += 1
        return size

    def _download(self, url: str) -> None:
        try:
            data = bytes(self.fs.cat_file(url))
        except Exception as exc:
            raise self._explain(url, exc) from None
        if not self._http:
            self.tally.requests += 1
            self.tally.bytes_fetched += len(data)
        self._whole[url] = data
        self.tally.sizes[url] = len(data)

    def _fetch(self, ranges: list[tuple[str, int, int]]) -> list[Any]:
        urls = [r[0] for r in ranges]
        starts = [r[1] for r in ranges]
        ends = [r[2] for r in ranges]
        try:
            results: list[Any] = self.fs.cat_ranges(urls, starts, ends, on_error="return")
        except Exception as exc:
            return [exc] * len(ranges)
        if not self._http:
            for out in results:
                if not isinstance(out, BaseException):
                    self.tally.requests += 1
                    self.tally.bytes_fetched += len(out)
        return results

    def _explain(self, url: str, error: BaseException) -> RemoteReadError:
        """One line for whatever the transport raised."""
        if isinstance(error, RemoteReadError):
            return error
        try:
            import aiohttp
        except ImportError:  # a non-HTTP filesystem without aiohttp
            aiohttp = None  # type: ignore[assignment]
        if isinstance(error, FileNotFoundError):
            return RemoteReadError(f"{url}: not found (HTTP 404)", f"check the URL; {AUTH_HINT}")
        if aiohttp is not None:
            if isinstance(error, aiohttp.TooManyRedirects):
                return RemoteReadError(
                    f"{url}: more than {MAX_REDIRECTS} redirects (a redirect loop?)", "check the URL with the server"
                )
            if isinstance(error, aiohttp.ClientResponseError):
                status = error.status
                if status in (401, 403):
                    word = "unauthorized" if status == 401 else "forbidden"
                    return RemoteReadError(f"{url}: access refused (HTTP {status} {word})", AUTH_HINT)
                return RemoteReadError(f"{url}: the server answered HTTP {status} {error.message}")
            if isinstance(error, aiohttp.ClientPayloadError):
                return RemoteReadError(
                    f"{url}: the reply ended before the bytes it announced (a truncated body)",
                    "run the command again; if it persists, the server or a proxy cuts replies short",
                )
            if isinstance(error, aiohttp.ClientConnectionError) and not isinstance(error, asyncio.TimeoutError):
                return RemoteReadError(f"{url}: cannot connect ({error})", "check the address and the network")
        if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
            return RemoteReadError(
                f"{url}: no complete reply within {self.timeout_s:g} s (a timeout)",
                "retry, or allow longer with --timeout SECONDS",
            )
        if isinstance(error, PermissionError):
            return RemoteReadError(f"{url}: access refused ({error})", "check the credentials of the filesystem")
        return RemoteReadError(f"{url}: cannot be read ({type(error).__name__}: {error})")
