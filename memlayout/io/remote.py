"""Byte ranges of files behind URLs: what a run shares (`RemoteTransport`) and what one source reads (`RemoteFiles`).

Inspecting a checkpoint needs its metadata, not its tensors: a safetensors header,
a zip's directory and pickle. So a remote file is read as a few byte ranges, and
every range of one step is fetched concurrently (`RemoteFiles.read_ranges`: one
request per shard header of a sharded model, all in flight at once; several ranges
of one file in one request where the server allows it).

A run opens one `RemoteTransport` and every source it reads shares it: one HTTP
session and connection pool (`memlayout.io.http_transport`, aiohttp), one fsspec
filesystem per other scheme (s3://, gs://, ..., used as the user installed
them; there the requests and bytes are counted as the ranges asked for). So the
descriptors and memory a run holds do not grow with the sources it reads. A
source read alone (`memlayout.inspect(url)`) gets a transport of its own, closed
with the source.

Each source's `RemoteFiles` keeps what it fetched (metadata only: tensor bytes for
--deep are not kept), so a loader may fetch the ranges it will need early, all
at once, and read them later as it parses.

Nothing here knows about tensors, and nothing is executed: bytes are only bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memlayout.errors import RangeNotSupportedError, RemoteReadError
from memlayout.io.remote_watch import AUTH_HINT, RUN_ENDED, Tally, Watch

if TYPE_CHECKING:
    from memlayout.io.http_transport import HttpTransport, Reply

__all__ = [
    "AUTH_HINT", "DEFAULT_TIMEOUT_S", "RemoteFiles", "RemoteTransport", "Tally", "connections_for",
    "start_importing_transport",
]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONNECTIONS = 64
"""Connections a run keeps open at once: 16 paths in flight, each with a few requests."""
MAX_CONNECTIONS = 128
DESCRIPTORS_KEPT = 64
"""Descriptors left for everything else (Python's own, the loop's, local files a run reads)."""


def connections_for(jobs: int) -> int:
    """How many connections a run with `jobs` paths in flight keeps: 4 a path, within the descriptors it may open.

    Each connection is a descriptor. Under a low `ulimit -n` the pool shrinks to
    fit, and requests wait for a free connection rather than fail with "Too many
    open files".
    """
    wanted = min(MAX_CONNECTIONS, max(16, 4 * jobs))
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no such limit (Windows)
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(4, min(wanted, (soft - DESCRIPTORS_KEPT) // 2))


def start_importing_transport() -> None:
    """Import aiohttp and memlayout's HTTP transport in a background thread, for a command about to read a URL.

    Importing aiohttp builds its TLS contexts (loading the system's CA
    certificates), which costs about as much as the rest of an inspect's start.
    OpenSSL loads them without the GIL, and the command's own imports (rules,
    reports) go on meanwhile, so a CLI that sees a URL among its paths calls this
    first. A failed import here is ignored: `RemoteTransport` imports again and
    reports it.
    """
    import contextlib

    def run() -> None:
        with contextlib.suppress(ImportError):
            import memlayout.io.http_transport  # noqa: F401

    threading.Thread(target=run, name="memlayout-import-transport", daemon=True).start()


def _missing_extra(what: str) -> RemoteReadError:
    return RemoteReadError(
        f"reading {what} needs aiohttp and fsspec, which are not installed",
        "install them with: pip install 'memlayout[remote]'",
    )


class RemoteTransport:
    """What every remote read of one run shares: one HTTP session and pool, one filesystem per other scheme.

    Args:
        timeout_s: Bound on each request, its redirects and retries included.
        connections: HTTP connections open at once, over every host.

    Example:
        >>> with RemoteTransport(timeout_s=10) as transport:  # doctest: +SKIP
        ...     files = RemoteFiles("https", transport=transport)
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, connections: int = DEFAULT_CONNECTIONS) -> None:
        self.timeout_s = timeout_s
        self.connections = connections
        self._lock = threading.Lock()
        self._http: HttpTransport | None = None
        self._filesystems: dict[str, Any] = {}
        self._closed = False

    def http(self) -> HttpTransport:
        """The run's HTTP session, started on first use; none once the run has closed it."""
        with self._lock:
            if self._closed:
                # A path's thread still at work when the run is interrupted opens no new session:
                # nothing would close it, and aiohttp would report it unclosed at exit.
                raise RemoteReadError(RUN_ENDED)
            if self._http is None:
                try:
                    from memlayout.io.http_transport import HttpTransport
                except ImportError:
                    raise _missing_extra("http:// and https:// URLs") from None
                self._http = HttpTransport(self.timeout_s, self.connections)
            return self._http

    def filesystem(self, protocol: str) -> Any:
        """The run's fsspec filesystem for `protocol` (s3, gs, ...), made on first use; none once the run closed."""
        with self._lock:
            if self._closed:
                raise RemoteReadError(RUN_ENDED)
            if protocol not in self._filesystems:
                try:
                    import fsspec
                except ImportError:
                    raise _missing_extra(f"{protocol}:// URLs") from None
                try:
                    self._filesystems[protocol] = fsspec.filesystem(protocol, skip_instance_cache=True)
                except (ImportError, ValueError) as exc:
                    raise RemoteReadError(
                        f"{protocol}:// URLs need an fsspec filesystem for {protocol}, which is not installed ({exc})",
                        f"install it (s3fs for s3://, gcsfs for gs://) or download the file; memlayout reads "
                        f"{protocol}:// through fsspec",
                    ) from None
            return self._filesystems[protocol]

    def close(self) -> None:
        """Close the HTTP session and its connections; safe to call more than once."""
        with self._lock:
            http, self._http = self._http, None
            self._filesystems.clear()
            self._closed = True
        if http is not None:
            http.close()

    def __enter__(self) -> RemoteTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RemoteFiles:
    """Reads byte ranges of one source's remote files; its tally is that source's.

    Args:
        protocol: The URL scheme ("https", "http", "s3", "gs", ...).
        transport: The run's shared transport; None makes one that `close` closes.
        timeout_s: Bound on each request, for a transport of its own.
        headers: Sent with every HTTP request to the origin of the URL asked (an
            Authorization header for the Hub never follows a redirect elsewhere).
        download: Allow reading a file whole when its server ignores Range requests.
        sizes: Files' sizes already known (the Hub's listing), by URL.
    """

    def __init__(
        self, protocol: str, *, transport: RemoteTransport | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: dict[str, str] | None = None, download: bool = False, sizes: dict[str, int] | None = None,
    ) -> None:
        self.protocol = protocol
        self._owned = transport is None
        self.transport = transport if transport is not None else RemoteTransport(timeout_s, connections=16)
        self.timeout_s = self.transport.timeout_s
        self.download = download
        self.headers = dict(headers or {})
        self.watch = Watch()
        self.watch.tally.sizes.update(sizes or {})
        self._spans: dict[str, list[tuple[int, bytes]]] = {}
        self._whole: dict[str, bytes] = {}
        self._is_http = protocol in ("http", "https")
        try:
            if self._is_http:
                self._http: HttpTransport | None = self.transport.http()
                self.fs: Any = None
            else:
                self._http = None
                self.fs = self.transport.filesystem(protocol)
        except BaseException:
            self.close()
            raise

    @property
    def tally(self) -> Tally:
        return self.watch.tally

    def close(self) -> None:
        """Close the transport if this source made its own; the run closes a shared one."""
        if self._owned:
            self.transport.close()

    # -- reads ---------------------------------------------------------------------

    def read(self, url: str, start: int, end: int, keep: bool = True) -> bytes:
        """Bytes `start .. end` of the file at `url` (fewer only past its end); `keep` False for tensor bytes."""
        return self.read_ranges([(url, start, end)], keep)[0]

    def read_ranges(self, ranges: Sequence[tuple[str, int, int]], keep: bool = True) -> list[bytes]:
        """Several (url, start, end) ranges, fetched concurrently (what is not held already), in the order asked.

        Args:
            ranges: Byte ranges; `start` below 0 asks for a file's last `-start` bytes.
            keep: Hold what is fetched for later reads of the same bytes.

        Raises:
            RemoteReadError: the first range that failed, as one line with a hint.
        """
        got = self.attempt(ranges, keep)
        for out in got:
            if isinstance(out, RemoteReadError):
                raise out
        return got  # type: ignore[return-value]  # no error is left

    def attempt(self, wants: Sequence[tuple[str, int, int | None]], keep: bool = True) -> list[bytes | RemoteReadError]:
        """Reads that succeed or fail each on its own, fetched concurrently; `end` None reads a whole file.

        Returns:
            Each read's bytes, or its error as one line (a 404 is a file that is not there).
        """
        results: list[bytes | RemoteReadError | None] = [self._held(*want) for want in wants]
        todo = [i for i, (_, start, end) in enumerate(wants)
                if results[i] is None and (end is None or end > start or start < 0)]
        asked = [self._clamped(*wants[i]) for i in todo]
        fetched = self._fetch(asked) if asked else []
        for index, (url, start, end), out in zip(todo, asked, fetched, strict=True):
            if isinstance(out, RangeNotSupportedError) and self.download:
                whole = self.attempt([(url, 0, None)])[0]
                results[index] = whole if isinstance(whole, RemoteReadError) else self._held(*wants[index])
            elif isinstance(out, BaseException):
                results[index] = self._explain(url, out)
            elif end is None:
                self._whole[url] = out
                self.tally.sizes.setdefault(url, len(out))
                results[index] = out
            else:
                results[index] = self._checked(url, start, end, out, keep)
        return [out if out is not None else b"" for out in results]

    def _checked(self, url: str, start: int, end: int, out: bytes, keep: bool) -> bytes | RemoteReadError:
        size = self.tally.sizes.get(url)
        if start < 0:  # a suffix of a file whose size the reply just gave
            start = max(0, size + start) if size is not None else 0
            end = size if size is not None else start + len(out)
        if len(out) != min(end, size if size is not None else end) - start:
            return RemoteReadError(
                f"{url}: asked for bytes {start}..{end} and got {len(out)} (a truncated reply)",
                "run the command again; if it persists, the server or a proxy cuts replies short",
            )
        if keep:
            self._spans.setdefault(url, []).append((start, out))
        return out

    def read_whole(self, url: str) -> bytes:
        """A small file in full (an index or config.json), in one request."""
        out = self.attempt([(url, 0, None)])[0]
        if isinstance(out, RemoteReadError):
            raise out
        return out

    def size(self, url: str) -> int:
        """The file's full size, from the listing, a ranged reply already received, or one metadata request."""
        known = self.tally.sizes.get(url)
        if known is not None:
            return known
        if url in self._whole:
            return len(self._whole[url])
        if self._http is not None:
            self.read(url, -1, 0)  # the last byte: its reply's Content-Range says the size
            return self.tally.sizes[url]
        try:
            size = int(self.fs.size(url))
        except Exception as exc:  # fsspec's and the filesystems' errors vary; each gets one line
            raise self._explain(url, exc) from None
        self.tally.sizes[url] = size
        self.tally.requests += 1
        return size

    def get_document(self, url: str) -> Reply:
        """A whole HTTP document of any status (the Hub's API), for the caller to read; network errors raise."""
        assert self._http is not None
        try:
            return self._http.get(url, self.headers, self.watch)
        except Exception as exc:
            raise self._explain(url, exc) from None

    # -- below the reads --------------------------------------------------------------

    def _held(self, url: str, start: int, end: int | None) -> bytes | None:
        whole = self._whole.get(url)
        if whole is not None:
            return whole[start:end] if start >= 0 else whole[start:]
        if end is None:
            return None
        size = self.tally.sizes.get(url)
        if start < 0:
            if size is None:
                return None
            start, end = max(0, size + start), size
        if size is not None:
            end = min(end, size)
        if end <= start:
            return b""
        # Bytes held may lie in consecutive spans (a header's first bytes, then its rest).
        pieces = []
        at = start
        for begin, data in sorted(self._spans.get(url, ()), key=lambda span: span[0]):
            if begin <= at < begin + len(data):
                piece = data[at - begin : min(end, begin + len(data)) - begin]
                pieces.append(piece)
                at += len(piece)
                if at >= end:
                    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return None

    def _clamped(self, url: str, start: int, end: int | None) -> tuple[str, int, int | None]:
        size = self.tally.sizes.get(url)
        if size is None or end is None:
            return url, start, end
        if start < 0:
            return url, max(0, size + start), size
        return url, start, min(end, size)

    def _fetch(self, wants: Sequence[tuple[str, int, int | None]]) -> list[Any]:
        if self._http is not None:
            from memlayout.io.http_transport import Want

            return self._http.fetch([Want(*want) for want in wants], self.headers, self.watch)
        return [self._fsspec_read(url, start, end) for url, start, end in wants]

    def _fsspec_read(self, url: str, start: int, end: int | None) -> Any:
        try:
            if end is None:
                data = bytes(self.fs.cat_file(url))
            else:
                if start < 0:
                    size = self.size(url)
                    start, end = max(0, size + start), size
                data = bytes(self.fs.cat_file(url, start=start, end=end))
        except Exception as exc:  # fsspec's and the filesystems' errors vary; each gets one line
            return exc
        self.tally.requests += 1
        self.tally.bytes_fetched += len(data)
        return data

    def _explain(self, url: str, error: BaseException) -> RemoteReadError:
        """One line for whatever the transport raised."""
        if isinstance(error, RemoteReadError):
            return error
        if isinstance(error, FileNotFoundError):
            return RemoteReadError(f"{url}: not found (HTTP 404)", f"check the URL; {AUTH_HINT}")
        if isinstance(error, TimeoutError):
            return RemoteReadError(
                f"{url}: no complete reply within {self.timeout_s:g} s (a timeout)",
                "retry, or allow longer with --timeout SECONDS",
            )
        if isinstance(error, PermissionError):
            return RemoteReadError(f"{url}: access refused ({error})", "check the credentials of the filesystem")
        return RemoteReadError(f"{url}: cannot be read ({type(error).__name__}: {error})")
