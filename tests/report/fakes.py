"""Reports built in memory from the report data types, for the format tests: no torch, no inspection.

A formatter reads a `BatchReport`; what it must do with one (escape a hostile name,
order by severity, say which rules did not run) is tested on these fakes. One
end-to-end test per format, on real checkpoints, stays in test_formats.py.
"""

from __future__ import annotations

from memlayout.core.facts import AliasGroup, AliasPair, Facts, SourceFact, StorageFact, TensorFact
from memlayout.core.strides import ByteSet, MemoryFormat, Relation
from memlayout.load.records import TensorKind
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.pipeline.inspection import Report, summarize
from memlayout.rules import RULES, Finding, Severity, SkippedRule

FLOAT32 = 4


def tensor(name: str, storage: str, shape: tuple[int, ...], stride: tuple[int, ...], offset: int = 0) -> TensorFact:
    """A float32 CPU tensor's facts, its bytes computed from shape, stride and offset as torch lays them out."""
    numel = 1
    for size in shape:
        numel *= size
    last = offset + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    contiguous = all(stride[i] == stride[i + 1] * shape[i + 1] for i in range(len(shape) - 1)) and stride[-1] == 1
    return TensorFact(
        name=name, names=(name,), kind=TensorKind.TENSOR, dtype="float32", itemsize=FLOAT32, device="cpu",
        shape=shape, stride=stride, storage=storage, offset=offset, numel=numel, nbytes=numel * FLOAT32,
        contiguous=contiguous, memory_format=MemoryFormat.CONTIGUOUS if contiguous else MemoryFormat.STRIDED,
        bytes_used=ByteSet(((offset * FLOAT32, (last + 1) * FLOAT32),), exact=True), self_overlapping=False,
        data_address=None, requires_grad=False, parameter_ids=(), optimizer_state=False, section="",
        pinned=None, shared_memory=None, has_data=True,
    )


def storage(name: str, nbytes: int, tensors: tuple[TensorFact, ...]) -> StorageFact:
    """A storage holding `tensors`, its used bytes the union of theirs."""
    used: list[tuple[int, int]] = []
    for start, end in sorted(t.bytes_used.span for t in tensors):
        if used and start <= used[-1][1]:
            used[-1] = (used[-1][0], max(used[-1][1], end))
        else:
            used.append((start, end))
    used_bytes = sum(end - start for start, end in used)
    return StorageFact(
        id=name, key=f"cpu:{name}", device="cpu", nbytes=nbytes, tensors=tuple(t.name for t in tensors),
        used=tuple(used), used_bytes=used_bytes, padding_bytes=0, unused_bytes=nbytes - used_bytes,
        base_address=None, has_data=True,
    )


def finding(code: str, tensors: tuple[str, ...], message: str, storage_id: str | None = None) -> Finding:
    """A finding of a registered rule, with the rule's name, severity and a hint of its own."""
    rule = RULES[code]
    return Finding(code, rule.name, rule.severity, tensors, message, f"the fix for {code}", storage_id)


def one_of_each_report(left: str = "encoder.left", path: str | None = "one_of_each.pt") -> Report:
    """One finding of each severity, facts as inspect gives them for `models.one_finding_of_each_severity_state`:
    ML101 (two slices overlap), ML201 (a transposed matrix), ML203 (a view 4 bytes in)."""
    overlapping = (tensor(left, "s0", (40,), (1,)), tensor("encoder.right", "s0", (44,), (1,), offset=20))
    transposed = tensor("proj.weight", "s1", (8, 8), (1, 8))
    shifted = tensor("norm.shifted", "s2", (64,), (1,), offset=1)
    facts = Facts(
        source=SourceFact(path=path, format="torch-zip" if path else "state-dict"),
        tensors=(*overlapping, transposed, shifted),
        storages=(storage("s0", 256, overlapping), storage("s1", 256, (transposed,)), storage("s2", 260, (shifted,))),
        alias_groups=(AliasGroup("s0", (left, "encoder.right"),
                                 (AliasPair(left, "encoder.right", Relation.PARTIAL),)),),
        modules=(),
        declared_ties=(),
    )
    findings = (
        finding("ML101", (left, "encoder.right"), f"{left} and encoder.right overlap partially in storage s0", "s0"),
        finding("ML201", ("proj.weight",), "proj.weight (shape [8, 8], stride [1, 8]) is not contiguous", "s1"),
        finding("ML203", ("norm.shifted",), "1 tensor (norm.shifted) does not start on a 16-byte boundary", "s2"),
    )
    assert [f.severity for f in findings] == [Severity.ERROR, Severity.WARNING, Severity.INFO]
    return Report(facts=facts, findings=findings, summary=summarize(facts, findings))


def batch(*reports: tuple[str, Report | None], skipped: tuple[SkippedRule, ...] = ()) -> BatchReport:
    """A batch of (path, report) pairs; a None report is a path that failed to load."""
    paths = []
    for path, report in reports:
        if report is None:
            paths.append(PathReport(path, error=f"{path}: no such file or directory"))
        else:
            if skipped:
                report = Report(report.facts, report.findings, report.summary, skipped)
            paths.append(PathReport(path, report=report))
    return BatchReport(tuple(paths))
