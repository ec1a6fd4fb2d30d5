"""One exception hierarchy. Every error carries a hint that says how to fix it.

The CLI turns any `MemlayoutError` into one line on stderr and exit code 2.
"""

from __future__ import annotations


class MemlayoutError(Exception):
    """Base of every error memlayout raises on purpose."""

    default_hint = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def one_line(self) -> str:
        """The message and the hint, as the single line the CLI prints."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(MemlayoutError):
    """The command line or API call asks for something inconsistent."""


class SourceNotFoundError(MemlayoutError):
    """The path does not exist, or an import spec does not resolve."""

    default_hint = "check the path or the `package.module:callable` spec"


class UnrecognizedFormatError(MemlayoutError):
    """The file exists but is no checkpoint format memlayout knows."""

    default_hint = (
        "memlayout reads torch.save files in zip, legacy non-zip or tar form, safetensors, Hugging Face "
        "directories, TorchScript, torch.export .pt2 and torch.distributed.checkpoint directories"
    )


class CorruptCheckpointError(MemlayoutError):
    """The file claims a known format but its contents are inconsistent."""

    default_hint = "the file is truncated or damaged; re-export it from its source"


class UnsafeContentError(MemlayoutError):
    """The operation needs real objects from a pickle that memlayout will not execute."""

    default_hint = "pass --trust only if you trust whoever wrote the file"


class FlattenError(MemlayoutError):
    """Flattening was refused or could not be verified; nothing was written."""


class OutputError(MemlayoutError):
    """An output could not be written; the previous file or folder is unchanged."""

    default_hint = "check the path, its permissions and the free space"


class TorchNotInstalledError(MemlayoutError):
    """What was asked runs torch, and torch is not installed (reading files needs none)."""

    default_hint = "install it with: pip install 'memlayout[torch]'"


class RemoteReadError(MemlayoutError):
    """A file behind a URL could not be read as asked: the server, the network or the reply is at fault."""

    default_hint = "check the URL; memlayout reads remote files by HTTP Range requests and never runs them"
