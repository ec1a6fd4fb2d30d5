"""The Hugging Face Hub's side of a remote read: a repository's file URLs, its listing, and the token.

huggingface_hub gives the Hub's address (HF_ENDPOINT), its URLs and the token.
The listing itself, `GET /api/models/ORG/NAME/tree/REV[/FOLDER]`, goes through the
run's shared HTTP transport like every other request, so `--timeout` bounds it and
its retries too: huggingface_hub's own client waits without a timeout and retries
five times with backoff, so a Hub that accepts a connection and never answers held
the command for as long as it stayed silent. The listing gives each file's size,
so no request is spent learning one. The Hub's errors (its `X-Error-Code` header)
become one RemoteReadError line with a hint.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from memlayout.errors import RemoteReadError
from memlayout.io.remote import AUTH_HINT

if TYPE_CHECKING:
    from memlayout.io.remote import RemoteFiles
    from memlayout.load.remote_location import RemoteLocation

MAX_PAGES = 1000
"""A listing's pages (1,000 entries each on the Hub) followed at most: a Link loop ends."""


def _hub() -> Any:
    try:
        import huggingface_hub
        from huggingface_hub import constants  # noqa: F401  (the Hub's address, HF_ENDPOINT)
    except ImportError:
        return None
    return huggingface_hub


class HubRepository:
    """A repository (or a folder or file of it) named by an `hf://` path or a bare Hub id.

    Raises:
        RemoteReadError: huggingface_hub is not installed, or the name is no ORG/NAME.
    """

    def __init__(self, location: RemoteLocation) -> None:
        if "/" not in location.repo and location.given.startswith("hf://"):
            raise RemoteReadError(
                f"{location.given}: expected hf://ORG/NAME[@REVISION][/PATH]", "name the repository as ORG/NAME"
            )
        self.hub = _hub()
        if self.hub is None:
            raise RemoteReadError(
                f"reading {location.given} from the Hugging Face Hub needs huggingface_hub, which is not installed",
                "install it with: pip install 'memlayout[remote]'",
            )
        self.location = location
        path = location.path_in_repo
        # A folder: the repository, a path ending in /, or a folder's config.json (its folder is the model).
        self.is_folder = not path or path.endswith("/") or posixpath.basename(path) == "config.json"
        self.folder = posixpath.dirname(path.rstrip("/")) if path.endswith("config.json") else path.strip("/")

    def url_of(self, path: str) -> str:
        """The `resolve` URL of a file of the repository."""
        url: str = self.hub.hf_hub_url(self.location.repo, path, revision=self.location.revision)
        return url

    def file_url(self) -> str:
        """The URL of the file the location names, or of its folder (ending in /)."""
        return self.folder_url() if self.is_folder else self.url_of(self.location.path_in_repo)

    def folder_url(self) -> str:
        return self.url_of(f"{self.folder}/x" if self.folder else "x")[: -len("x")]

    def headers(self) -> dict[str, str]:
        """The token, for the Hub's origin only (a redirect elsewhere never carries it)."""
        token = self.hub.get_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def listing(self, files: RemoteFiles) -> dict[str, int]:
        """The folder's files (names relative to it) and their sizes, from the Hub's tree API.

        Raises:
            RemoteReadError: the repository, revision or folder is not there, gated, or the Hub failed.
        """
        location = self.location
        endpoint = self.hub.constants.ENDPOINT.rstrip("/")
        folder = f"/{quote(self.folder)}" if self.folder else ""
        url: str | None = (
            f"{endpoint}/api/models/{location.repo}/tree/{quote(location.revision, safe='')}{folder}"
        )
        found: dict[str, int] = {}
        for _ in range(MAX_PAGES):
            if url is None:
                break
            reply = files.get_document(url)
            if reply.status != 200:
                raise self._refusal(reply.status, reply.headers.get("X-Error-Code", ""))
            try:
                entries = orjson.loads(reply.body)
                for entry in entries:
                    if entry.get("type") == "file":
                        name = posixpath.normpath(str(entry["path"]))
                        found[name[len(self.folder) + 1:] if self.folder else name] = int(entry.get("size", 0))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise RemoteReadError(
                    f"{location.given}: the Hub's listing of {location.repo} is not what the Hub sends ({exc})",
                    "check HF_ENDPOINT: it should name the Hub or a mirror of its API",
                ) from None
            following = reply.headers.get("Link", "")
            url = _next_page(following)
        return found

    def _refusal(self, status: int, code: str) -> RemoteReadError:
        location = self.location
        what = f"{location.repo}@{location.revision}"
        if code == "GatedRepo":
            return RemoteReadError(f"{location.given}: the Hub repository {what} is gated (HTTP {status})", AUTH_HINT)
        if code == "RevisionNotFound":
            return RemoteReadError(
                f"{location.given}: the Hub repository {location.repo} has no revision {location.revision}",
                "name a branch, tag or commit that exists",
            )
        if code == "EntryNotFound" and self.folder:
            return RemoteReadError(
                f"{location.given}: the Hub repository {what} has no folder {self.folder}",
                "check the path after the repository's name",
            )
        if code == "RepoNotFound" or status in (401, 403, 404):
            local = "no such file or directory, and " if not location.given.startswith("hf://") else ""
            revision = "" if location.revision == "main" else f" at revision {location.revision}"
            return RemoteReadError(
                f"{location.given}: {local}the Hub has no model repository {location.repo}{revision} that this "
                f"token can see (HTTP {status})",
                AUTH_HINT,
            )
        return RemoteReadError(f"{location.given}: the Hub answered HTTP {status} for {what}",
                               "retry later; check HF_ENDPOINT if it persists")


def _next_page(link: str) -> str | None:
    """The `rel="next"` URL of a Link header, as the Hub pages its listings."""
    for part in link.split(","):
        target, _, params = part.partition(";")
        if 'rel="next"' in params.replace(" ", "") and target.strip().startswith("<"):
            return target.strip()[1:-1]
    return None
