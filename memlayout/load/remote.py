"""Checkpoints behind URLs and on the Hugging Face Hub, read from the few byte ranges that describe them.

What is fetched, by format (every step's ranges concurrently; see also
`remote_zip` and `remote_dir`):
- safetensors: the first 64 bytes (the header length, and what detection reads),
  then the rest of the header;
- a torch.save zip: the first 64 bytes and the file's end (its end records and
  directory) in one request, then every storage record's local header (where its
  data starts, which is where torch maps it, so alignment is checked on real
  offsets) and data.pkl, in one more;
- a model folder (a Hub repository, a URL to its index, to its config.json, or
  to the folder itself ending in /): config.json with the index (or the weights'
  first bytes), then every shard's header at once, each asked for the length its
  tensor names in the index make.
Tensor bytes are fetched only when asked (`RemoteOptions.fetch_contents`, from
--deep); otherwise the rules that read them are skipped, and the report says so.

A file's size comes from the Hub's listing or from the first ranged reply (its
Content-Range), so no HEAD request is spent on it. The report's note gives the
bytes fetched and the requests made beside the size.

Nothing remote is executed, whatever the caller's --trust: pickles go through the
restricted unpickler as on disk, and the formats that are code (TorchScript,
torch.export) or that need the whole file (legacy torch.save, tar, bare pickles)
are refused with a hint to download them.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from memlayout.format_bytes import human_bytes
from memlayout.io.remote import RemoteFiles
from memlayout.load.remote_dir import folder_of, load_folder
from memlayout.load.remote_file import load_file
from memlayout.load.remote_hub import HubRepository
from memlayout.load.remote_location import RemoteLocation, RemoteOptions

if TYPE_CHECKING:
    from memlayout.load.records import LoadedSource

__all__ = ["fetch_remote_config", "load_remote", "remote_note"]


def load_remote(location: RemoteLocation, options: RemoteOptions) -> LoadedSource:
    """Read a remote checkpoint: one file, a model folder, or a Hub repository (whole or a folder of it).

    Args:
        location: Where it is (`remote_location`).
        options: Timeout, full downloads, whether tensor bytes are fetched, and the
            run's shared transport (one of its own when None).

    Returns:
        The source, named as the user gave it, with a note of what the reads cost.

    Raises:
        RemoteReadError: the server, the network or the reply failed; one line with a hint.
        CorruptCheckpointError, UnrecognizedFormatError: as for a local file.
    """
    hub = HubRepository(location) if location.protocol == "hf" else None
    url = hub.file_url() if hub is not None else location.url
    files = RemoteFiles(
        url.partition("://")[0], transport=options.transport, timeout_s=options.timeout_s,
        headers=hub.headers() if hub is not None else None, download=options.download,
    )
    try:
        if hub is not None and hub.is_folder:
            listing = hub.listing(files)
            source = load_folder(location.given, hub.folder_url(), listing, files, options)
        elif hub is None and folder_of(url) is not None:
            source = load_folder(location.given, folder_of(url) or "", None, files, options, index=_index_name(url))
        else:
            source = load_file(url, files, options)
            source.path = location.given
        source.notes.append(remote_note(files))
    except BaseException:
        files.close()
        raise
    if not options.fetch_contents:
        files.close()  # nothing reads later; a --deep source's reader closes it
    return source


def _index_name(url: str) -> str | None:
    name = posixpath.basename(url)
    return name if name.endswith(".index.json") else None


def remote_note(files: RemoteFiles) -> str:
    """What the reads cost beside what the files hold: "read remotely: 1.2 KiB fetched in 2 requests, of 5.0 MiB (1
    file)"."""
    tally = files.tally
    count = len(tally.sizes)
    return (
        f"read remotely: {human_bytes(tally.bytes_fetched)} fetched in {tally.requests} "
        f"request{'s' if tally.requests != 1 else ''}, of {human_bytes(sum(tally.sizes.values()))} "
        f"({count} file{'s' if count != 1 else ''}); not checked remotely: whether a file is also valid as "
        "another container format (ML603 reads its other ends)"
    )


def fetch_remote_config(location: RemoteLocation, options: RemoteOptions) -> tuple[str, bytes]:
    """A remote model's config.json, alone: for `memlayout activations`, which builds from it.

    Args:
        location: A URL of the config.json or of its folder, or a Hub repository (or a folder in it).
        options: The timeout.

    Returns:
        (the config's URL, its bytes).
    """
    from memlayout.load.hf_dir import CONFIG

    headers: dict[str, str] | None = None
    if location.protocol == "hf":
        hub = HubRepository(location)
        path = location.path_in_repo or CONFIG
        if not path.endswith(".json"):
            path = f"{path.rstrip('/')}/{CONFIG}"
        url = hub.url_of(path)
        headers = hub.headers()
    else:
        url = location.url if location.url.endswith(".json") else f"{location.url.rstrip('/')}/{CONFIG}"
    files = RemoteFiles(url.partition("://")[0], transport=options.transport, timeout_s=options.timeout_s,
                        headers=headers)
    try:
        return url, files.read_whole(url)
    finally:
        files.close()
