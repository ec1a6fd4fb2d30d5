"""Every error memlayout raises on purpose is defined in `memlayout/errors.py` (issue 30 §5).

Errors once lived beside the code raising them (the CLI's inspect, the ranks,
activations, remote reads), so the hierarchy a caller catches could not be read in
one place. This scans the package's source: an exception class defined anywhere
else must be one of the few below, each a signal between two functions that never
reaches a user.
"""

from __future__ import annotations

import ast
from pathlib import Path

import memlayout
import memlayout.errors

PACKAGE = Path(memlayout.__file__).parent

SIGNALS_THAT_NEVER_LEAVE = {
    # Raised inside the unpickler and caught by the legacy loader, which turns it into a
    # CorruptCheckpointError; it must be a pickle.UnpicklingError for the pickle machinery.
    ("load/restricted_pickle.py", "TextPersistentIdError"),
    # Raised from torch's dispatch inside a fake step and found in the cause chain by the analysis.
    ("activations/trace/fake_step.py", "ValueFromInputsError"),
    # Raised by _torch.fake_cuda_device_guard and turned into a UsageError by trace/fake_cuda.py.
    ("_torch.py", "FakeCudaGuardUnavailable"),
    # Private: tells typer's coercion apart from memlayout's own.
    ("cli/coercion.py", "_TyperCoerces"),
    # Private: a failure worth another try, and a kept redirect target to resolve again, inside one request.
    ("io/http_transport.py", "_Retry"),
    ("io/http_transport.py", "_Expired"),
}


def _exception_classes() -> set[tuple[str, str]]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            if any(base.endswith(("Error", "Exception")) or base == "MemlayoutError" for base in bases):
                found.add((path.relative_to(PACKAGE).as_posix(), node.name))
    return found


def test_every_error_class_is_defined_in_errors_py() -> None:
    outside = {(path, name) for path, name in _exception_classes() if path != "errors.py"}
    assert outside == SIGNALS_THAT_NEVER_LEAVE


def test_every_error_in_errors_py_is_a_memlayout_error_with_a_docstring() -> None:
    defined = [name for path, name in _exception_classes() if path == "errors.py"]
    assert len(defined) > 10
    for name in defined:
        cls = getattr(memlayout.errors, name)
        assert issubclass(cls, memlayout.errors.MemlayoutError), name
        assert cls.__doc__, name
