"""What a file's name claims it holds: never used to choose a reader, only to say when a name lies.

memlayout reads every file by its content (`memlayout.load.FORMATS`). People and
other tools go by the name: a `model.safetensors` is loaded with safetensors,
which runs no code, and a `notes.txt` is opened in an editor. A name that claims a
format its content is not is how a pickle gets past a reviewer or a loader picked
by suffix, and ML604 reports it. Only names that make a claim are listed: `.pt`,
`.pth`, `.bin`, `.ckpt`, `.pkl` and `.joblib` are worn by several formats (a
torch.save zip, a legacy file, a bare pickle), so they claim nothing in particular.
"""

from __future__ import annotations

_ZIPS = ("zip", "torch-zip", "npz", "torchscript", "torch-export")
_NOT_A_MODEL = ()
"""The name claims a format memlayout reads no model from (text, an image): any checkpoint or pickle lies."""

SUFFIX_CLAIMS: dict[str, tuple[str, ...]] = {
    ".safetensors": ("safetensors",),
    ".npy": ("npy",),
    ".npz": ("npz",),
    ".pt2": ("torch-export",),
    ".zip": _ZIPS,
    ".tar": ("tar", "torch-legacy-tar"),
    ".gz": ("gzip",),
    ".tgz": ("gzip",),
    ".xz": ("xz",),
    ".txz": ("xz",),
    ".lzma": ("lzma",),
    ".bz2": ("bz2",),
    ".lz4": ("lz4",),
    ".json": _NOT_A_MODEL,
    ".txt": _NOT_A_MODEL,
    ".md": _NOT_A_MODEL,
    ".csv": _NOT_A_MODEL,
    ".yaml": _NOT_A_MODEL,
    ".yml": _NOT_A_MODEL,
    ".png": _NOT_A_MODEL,
    ".jpg": _NOT_A_MODEL,
    ".jpeg": _NOT_A_MODEL,
    ".gif": _NOT_A_MODEL,
}
"""Each suffix that claims a format, and the `FORMATS` names (or containers) content may have under it."""

CONVENTIONS: dict[str, tuple[str, ...]] = {
    ".pth.tar": ("torch-zip", "torch-legacy", "torch-legacy-tar", "tar"),
}
"""Double suffixes worn by convention: `checkpoint.pth.tar` is torch.save's zip in PyTorch's own ImageNet
example, not a tar archive."""


def claimed_formats(path: str) -> tuple[str, tuple[str, ...]] | None:
    """The suffix of `path` that claims a format, and the formats it allows; None when the name claims none.

    Args:
        path: A file's path (only its last component is read).

    Returns:
        (suffix, formats) where `formats` is empty for a name that claims no model at
        all (`.json`, `.png`); None for a name that claims nothing in particular.
    """
    name = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    for suffix, formats in CONVENTIONS.items():
        if name.endswith(suffix):
            return suffix, formats
    dot = name.rfind(".")
    if dot <= 0:
        return None
    suffix = name[dot:]
    claims = SUFFIX_CLAIMS.get(suffix)
    return None if claims is None else (suffix, claims)
