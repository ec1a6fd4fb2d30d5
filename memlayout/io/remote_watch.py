"""What one source's remote reads cost and saw: requests, bytes, each file's size and ETag.

A run shares one transport between its sources (`memlayout.io.remote`); each
source keeps its own `Watch`, so a report's note counts that source's reads alone,
and a file replaced while it is read is caught per source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from memlayout.errors import RemoteReadError

AUTH_HINT = (
    "a private or gated Hugging Face repository needs a token: set the HF_TOKEN environment variable "
    "(memlayout sends it only to the Hub's endpoint)"
)
RUN_ENDED = "the run ended before this read (memlayout was interrupted)"
"""A read asked for after the run closed its transport: a path's thread still at work when it was interrupted."""


@dataclass
class Tally:
    """What the reads of one source cost, over every file they touched."""

    requests: int = 0
    """HTTP requests sent, redirects included (or ranges asked for, on other filesystems)."""
    bytes_fetched: int = 0
    """Response body bytes received."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Each file's full size, by URL, as the server (or the Hub's listing) reported it."""


@dataclass
class Watch:
    """One source's tally, and the ETag each of its files had when first read."""

    tally: Tally = field(default_factory=Tally)
    etags: dict[str, str] = field(default_factory=dict)

    def size_of(self, url: str) -> int | None:
        """The file's size, where a reply or the listing said it."""
        return self.tally.sizes.get(url)

    def saw(self, url: str, status: int, headers: Mapping[str, str]) -> None:
        """Note a reply's file size and ETag.

        Raises:
            RemoteReadError: the ETag differs from the one an earlier reply had: the
                file was replaced between two reads, and ranges of two files are no file.
        """
        if status == 206:
            total = headers.get("Content-Range", "").rpartition("/")[2]
            if total.isdigit():
                self.tally.sizes[url] = int(total)
        etag = headers.get("ETag")
        if etag and status in (200, 206):
            seen = self.etags.setdefault(url, etag)
            if seen != etag:
                raise RemoteReadError(
                    f"{url} changed while it was being read (ETag {seen} became {etag})",
                    "run the command again once the upload is finished",
                )
