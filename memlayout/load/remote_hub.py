"""The Hugging Face Hub's side of a remote read: a repository's file URLs, its listing, and the token.

huggingface_hub is imported only when a location names the Hub, and its errors
become one RemoteReadError line with a hint.
"""

from __future__ import annotations

import posixpath
from typing import Any

from memlayout.errors import RemoteReadError
from memlayout.io.remote import AUTH_HINT
from memlayout.load.remote_location import RemoteLocation, RemoteOptions


def hub_url_maker(location: RemoteLocation) -> Any:
    """huggingface_hub's `hf_hub_url`, or the one line that says it is not installed."""
    try:
        from huggingface_hub import hf_hub_url
    except ImportError:
        raise RemoteReadError(
            f"reading {location.given} from the Hugging Face Hub needs huggingface_hub, which is not installed",
            "install it with: pip install 'memlayout[remote]'",
        ) from None
    return hf_hub_url


def hub_headers() -> dict[str, str]:
    from huggingface_hub import get_token

    token = get_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def hub_target(location: RemoteLocation, options: RemoteOptions) -> tuple[str, list[str] | None]:
    """(the URL of the file, or of the repository's folder; the repository's files, for a folder)."""
    if "/" not in location.repo and location.given.startswith("hf://"):
        raise RemoteReadError(
            f"{location.given}: expected hf://ORG/NAME[@REVISION][/PATH]", "name the repository as ORG/NAME"
        )
    hf_hub_url = hub_url_maker(location)
    if location.path_in_repo:
        return hf_hub_url(location.repo, location.path_in_repo, revision=location.revision), None
    folder = hf_hub_url(location.repo, "x", revision=location.revision)[: -len("x")]
    return folder, hub_listing(location, options)


def hub_listing(location: RemoteLocation, options: RemoteOptions) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )


    what = f"{location.repo}@{location.revision}"
    try:
        names = HfApi().list_repo_files(location.repo, revision=location.revision)
    except GatedRepoError:
        raise RemoteReadError(f"{location.given}: the Hub repository {what} is gated (HTTP 403)", AUTH_HINT) from None
    except RevisionNotFoundError:
        raise RemoteReadError(
            f"{location.given}: the Hub repository {location.repo} has no revision {location.revision}",
            "name a branch, tag or commit that exists",
        ) from None
    except (RepositoryNotFoundError, HfHubHTTPError) as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if not isinstance(exc, RepositoryNotFoundError) and status not in (401, 403, 404):
            raise RemoteReadError(f"{location.given}: the Hub answered HTTP {status} for {what}") from None
        local = "no such file or directory, and " if not location.given.startswith("hf://") else ""
        raise RemoteReadError(
            f"{location.given}: {local}the Hub has no model repository {location.repo}"
            f"{'' if location.revision == 'main' else f' at revision {location.revision}'} that this token can see "
            f"(HTTP {status})",
            AUTH_HINT,
        ) from None
    except Exception as exc:  # the transport's own errors (connection, timeout) vary by version
        raise RemoteReadError(
            f"{location.given}: cannot list the Hub repository {what} ({type(exc).__name__}: {exc})".split("\n")[0],
            "check the network; HF_ENDPOINT sets the Hub's address",
        ) from None
    return [posixpath.normpath(name) for name in names]
