"""Which file of a model folder holds a finding: the one a user opens, and flatten rewrites, to fix it."""

from __future__ import annotations

from memlayout.core.facts import Facts
from memlayout.rules.registry import Finding


def file_of(finding: Finding, facts: Facts) -> str:
    """The weight file (a shard) of a model folder that holds a finding.

    Args:
        finding: One of the source's findings.
        facts: The source's facts.

    Returns:
        The file's name relative to the folder, from the finding's storage or else its
        first tensor's; "" for a source of one file, and for a finding that names
        neither (ML204 counts a folder's files together).
    """
    if not facts.source.files:
        return ""
    storage = finding.storage
    if storage is None:
        tensor = next((t for t in map(facts.tensor, finding.tensors) if t is not None), None)
        storage = tensor.storage if tensor is not None else None
    if storage is None:
        return ""
    try:
        return facts.storage(storage).file
    except KeyError:  # a storage the facts do not hold: the finding stays on the folder
        return ""
