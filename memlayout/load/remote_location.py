"""Which command-line paths are remote, and where they point: parsed without any import or request.

Three spellings are remote:
- a URL with a scheme: `https://host/model.safetensors`, `http://...`, and any
  scheme an installed fsspec filesystem reads (`s3://bucket/key`, `gs://...`); a
  URL ending in `/`, `config.json` or `.index.json` names a model folder;
- `hf://ORG/NAME[@REVISION][/PATH]`: a Hugging Face Hub repository, or one file
  of it, at a branch, tag or commit (`main` by default);
- a bare Hub id, `ORG/NAME` or `NAME`, but only when nothing of that name exists
  on disk, it is no `package.module:callable` import spec, and it does not end
  like a checkpoint file (`model.pt`): a mistyped local file stays "no such file",
  never a request to the Hub.
A local path always wins over a Hub id of the same spelling.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from memlayout.io.remote import RemoteTransport

HF_SCHEME = "hf://"
DEFAULT_REVISION = "main"
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}(?:@[A-Za-z0-9._/-]+)?$")
# A missing name that ends like a checkpoint or a config is a mistyped file, not a model id.
_FILE_ENDINGS = (
    ".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".pkl", ".pickle", ".pt2", ".tar", ".json", ".zip", ".ts",
)


class RemoteOptions(NamedTuple):
    """How remote sources are read (the CLI's --timeout and --download, and --deep)."""

    timeout_s: float = 30.0
    """Bound on each request, in seconds."""
    download: bool = False
    """Download a file whole when its server ignores Range requests (otherwise refuse)."""
    fetch_contents: bool = False
    """Fetch tensor bytes by range for the rules that read them (--deep); otherwise they are skipped."""
    transport: RemoteTransport | None = None
    """The run's shared HTTP session and pool (`memlayout.io.remote`); None: each source opens and closes its own."""


class RemoteLocation(NamedTuple):
    """A remote source: one file behind a URL, or a Hub repository (whole or one file of it)."""

    given: str
    """As the user wrote it; reports name the source so."""
    protocol: str
    """"https", "http", "s3", ...; "hf" for the Hub."""
    url: str
    """The file's URL; for the Hub, empty (see `repo`)."""
    repo: str = ""
    """The Hub repository id, ORG/NAME or NAME."""
    revision: str = DEFAULT_REVISION
    path_in_repo: str = ""
    """One file of the repository, or "" for the repository as a model directory."""


def remote_location(path: str) -> RemoteLocation | None:
    """Where `path` points when it is remote; None for a local path (or an import spec).

    Args:
        path: As given on the command line.

    Returns:
        The location, or None when `path` is to be read from disk.
    """
    if path.startswith(HF_SCHEME):
        return _hub_location(path, path[len(HF_SCHEME):], explicit=True)
    match = _SCHEME.match(path)
    if match is not None:
        protocol = match.group(1).lower()
        if protocol == "file":
            return None
        return RemoteLocation(path, protocol, path)
    if looks_like_hub_id(path):
        return _hub_location(path, path, explicit=False)
    return None


def looks_like_hub_id(path: str) -> bool:
    """Whether a path that may be missing on disk is to be read as a bare Hub id."""
    if os.path.lexists(path) or not _HUB_ID.match(path) or ".." in path:
        return False
    if ":" in path:  # an import spec
        return False
    return not path.lower().endswith(_FILE_ENDINGS)


def _hub_location(given: str, rest: str, explicit: bool) -> RemoteLocation | None:
    parts = rest.split("/")
    if explicit:
        # hf://ORG/NAME[@REV][/PATH...]: the repository is always two segments.
        if len(parts) < 2 or not parts[0] or not parts[1]:
            return RemoteLocation(given, "hf", "", repo=rest)  # refused with its message by the loader
        repo_parts, path_parts = parts[:2], parts[2:]
    else:
        repo_parts, path_parts = parts, []
    name, _, revision = repo_parts[-1].partition("@")
    repo = "/".join([*repo_parts[:-1], name])
    return RemoteLocation(given, "hf", "", repo=repo, revision=revision or DEFAULT_REVISION,
                          path_in_repo="/".join(path_parts))
