"""Legacy torch.save files (the non-zip stream, and the tar format before it) rewritten as a current zip.

torch.load cannot map these files, so torch loads IN, the loaded tensors move
into the flat buffers (`loaded_tree`), and the same object tree is saved with a
current `torch.save`: the format changes, which the summary says. Without
--trust nothing from the file executes: the non-zip stream goes through
torch's own weights-only loader; the tar format, which that loader refuses
outright, goes through torch's tar reader with an unpickler that resolves only
the globals of torch's weights-only allow-list (the same list memlayout checks
pickles against), so a file that names anything else needs --trust. So does a
non-zip file saved with a pickle protocol torch's weights-only loader cannot
read (1, 4 or 5: it knows neither protocol 1's text LONG nor protocol 4's FRAME).
"""

from __future__ import annotations

import pickle
import types
from typing import Any

from memlayout.core.facts import Facts
from memlayout.errors import UnsafeContentError, UsageError
from memlayout.flatten.plan import FlatPlan, describe_changes
from memlayout.flatten.save import verify_torch_file, write_torch
from memlayout.flatten.verification import BUFFERS_WRITTEN, LAYOUT, MAIN_NAMES
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.flatten.writers.loaded_tree import flatten_loaded_tree
from memlayout.load.detect import has_proto_signature
from memlayout.load.main_module import classes_from_main, pickle_module_resolving_main
from memlayout.load.records import LoadedSource
from memlayout.load.weights_only_allowlist import WEIGHTS_ONLY_PROTOCOLS, weights_only_allows

_WHICH = {"torch-legacy": "legacy (non-zip) torch.save file", "torch-legacy-tar": "tar-format torch.save file"}


class AllowListUnpickler(pickle.Unpickler):
    """A real unpickler that resolves only globals of torch's weights-only allow-list.

    What it builds is what `torch.load(weights_only=False)` builds, for a pickle
    whose every global is on the list; any other global is refused before it is
    imported, so no code from the file runs.
    """

    def find_class(self, module: str, name: str) -> Any:
        if not weights_only_allows(module, name):
            raise pickle.UnpicklingError(f"{module}.{name} is outside torch's weights-only allow-list")
        # The allow-list is checked on Python 3 spellings; Unpickler maps them again itself.
        return super().find_class(module, name)


def _allow_list_pickle_module() -> Any:
    # torch's tar reader takes a pickle module and uses its load() and Unpickler;
    # it refuses only torch's own weights-only module by identity.
    return types.SimpleNamespace(
        __name__="memlayout_allow_list",
        Unpickler=AllowListUnpickler,
        load=lambda file, **kwargs: AllowListUnpickler(file, **kwargs).load(),
    )


def _weights_only_reads(path: str) -> bool:
    # torch.save writes every pickle of a file with one protocol, and the header's
    # first pickle shows it: PROTO n from protocol 2 on, none before.
    with open(path, "rb") as handle:
        head = handle.read(2)
    return has_proto_signature(head) and head[1] in WEIGHTS_ONLY_PROTOCOLS


def load_legacy_tree(path: str, tar: bool, trust: bool, main_module: str | None = None) -> Any:
    """The object a legacy torch.save file holds, as torch.load builds it, on the CPU.

    Args:
        path: The file.
        tar: It is the tar format.
        trust: Real unpickling is allowed (module pickles, any global).
        main_module: With `trust`, the module that defines what the pickle names `__main__.Name`.

    Returns:
        The loaded tree.

    Raises:
        UnsafeContentError: without trust, a global outside the allow-list.
        UsageError: with trust, a class the pickle names cannot be imported.
    """
    import torch

    try:
        if trust and main_module is not None:
            return torch.load(path, map_location="cpu", weights_only=False,
                              pickle_module=pickle_module_resolving_main(main_module))
        if trust:
            return torch.load(path, map_location="cpu", weights_only=False)
        if tar or not _weights_only_reads(path):
            return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_allow_list_pickle_module())
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeContentError(
            f"{path} cannot be loaded weights-only: {str(exc).splitlines()[0]}",
            "pass --trust only if you trust whoever wrote the file",
        ) from exc
    except (AttributeError, ImportError) as exc:
        raise UsageError(
            f"{path}: a class the pickle needs cannot be imported here ({exc})",
            "put the model's code on PYTHONPATH, or install its package, so that its classes import",
        ) from exc


class LegacyWriter(FlattenWriter):
    """Loads a legacy file with torch, moves its tensors into the flat buffers, saves a current zip."""

    formats = ("torch-legacy", "torch-legacy-tar")

    def label(self, source: LoadedSource) -> str:
        kind = "module pickle" if source.modules else "state dict"
        return f"{_WHICH[source.format]} ({kind}), written as a current torch.save zip"

    def changes(self, plan: FlatPlan, facts: Facts, source: LoadedSource) -> list[str]:
        # The format itself changes, so a legacy file is never already flat.
        return [f"the format: a {_WHICH[source.format]} becomes a current torch.save zip",
                *describe_changes(plan, facts)]

    def write(self, job: FlattenJob) -> Written:
        tree = load_legacy_tree(
            job.path, job.source.format == "torch-legacy-tar", job.options.trust, job.options.main_module
        )
        # torch.save writes the location each storage is given, so IN's devices are
        # kept by moving the bytes on the CPU and naming them: no GPU is needed.
        done = flatten_loaded_tree(tree, job, on_host=job.options.keeps_devices)
        names = {name for tensor in job.facts.tensors for name in tensor.names}

        def verify(temporary: str) -> None:
            verify_torch_file(temporary, done.plan, done.buffers, names,
                              from_main=classes_from_main(job.source.pickle_globals))

        written = write_torch(
            tree, job.out, verify if job.options.verify else None, done.locations, job.objects_from_main()
        )
        from_main = (MAIN_NAMES,) if classes_from_main(job.source.pickle_globals) else ()
        return Written(done.bytes_copied, written, (BUFFERS_WRITTEN, LAYOUT, *from_main))


WRITER = LegacyWriter()
