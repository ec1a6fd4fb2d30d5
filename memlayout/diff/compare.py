"""Facts of A and B -> change records. Pure: reads two reports, returns changes.

Tensors are matched by key (see `names`). A name that one side does not store but
whose own declared ties restore (a config's `tie_word_embeddings`, a safetensors
file's metadata, `--tie`) resolves to the tensor it is restored from, exactly as
ML103 lets a saver drop the tied copy: `save_pretrained` writing
`transformer.wte.weight` alone is not a lost tie when config.json ties
`lm_head.weight` to it, and is one when nothing does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from memlayout.core.facts import TensorFact, where_apart
from memlayout.core.strides import Relation
from memlayout.diff.changes import Change, ChangeKind
from memlayout.diff.names import NameMap, keyed
from memlayout.diff.values import ValueComparison
from memlayout.format_bytes import human_bytes
from memlayout.load.records import DeclaredTie
from memlayout.pipeline.inspection import Report
from memlayout.rules import Finding, Severity

ValueComparer = Callable[[TensorFact, TensorFact], ValueComparison | None]

# The order changes are listed in, within one severity: what breaks a model first.
_KIND_ORDER = {kind: index for index, kind in enumerate(ChangeKind)}
_OVERLAP_WORDS = {Relation.CONTAINS: "one contains the other", Relation.PARTIAL: "they overlap partially"}


@dataclass
class _Side:
    """One checkpoint, indexed by key."""

    report: Report
    label: str
    key_of: Callable[[str], str]
    names: dict[str, str] = field(default_factory=dict)
    """key -> the side's own name."""
    equal: set[frozenset[str]] = field(default_factory=set)
    """Pairs of distinct views (by first name) over exactly the same bytes."""
    overlapping: dict[frozenset[str], Relation] = field(default_factory=dict)
    restored: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Missing key -> (key it is restored from, who declares it)."""
    declared: list[tuple[str, str, str]] = field(default_factory=list)
    """(target key, source key, who declares it) for every declared tie."""

    @classmethod
    def build(
        cls,
        report: Report,
        label: str,
        key_of: Callable[[str], str],
        ties: Iterable[tuple[str, str]],
        restoring: Iterable[DeclaredTie],
        other_keys: set[str] | frozenset[str] = frozenset(),
    ) -> _Side:
        side = cls(report, label, key_of)
        side.names = keyed((n for t in report.facts.tensors for n in t.names), key_of, label)
        # `restoring` is this side's config asked about the other side's names too. A
        # name only the other side stores is restored here only when the other side
        # also stores the name it is restored from: one model saved two ways, not a
        # GPT-2 config tying a Llama's lm_head.weight.
        restoring = [tie for tie in restoring if side._restores_here(key_of(tie.target), key_of(tie.source),
                                                                     other_keys)]
        for group in report.facts.alias_groups:
            for pair in group.pairs:
                names = frozenset((pair.first, pair.second))
                side.overlapping[names] = pair.relation
                if pair.relation is Relation.EQUAL:
                    side.equal.add(names)
        declared = [(t.target, t.source, t.declared_by) for t in (*report.facts.declared_ties, *restoring)]
        declared += [(target, source, "--tie") for target, source in ties]
        for target, source, declared_by in dict.fromkeys(declared):
            kt, ks = key_of(target), key_of(source)
            side.declared.append((kt, ks, f"{label}'s {declared_by}" if declared_by != "--tie" else declared_by))
            # Either end may be the dropped one: ML103 skips a declared tie with a
            # missing name whichever it is, and so does the loader that re-ties it.
            if kt not in side.names and ks in side.names:
                side.restored.setdefault(kt, (ks, declared_by))
            elif ks not in side.names and kt in side.names:
                side.restored.setdefault(ks, (kt, declared_by))
        return side

    def _restores_here(self, target: str, source: str, other_keys: set[str] | frozenset[str]) -> bool:
        stored = [key for key in (target, source) if key in self.names]
        return len(stored) == 2 or (len(stored) == 1 and stored[0] in other_keys)

    def view(self, key: str) -> TensorFact | None:
        """The view a key reaches, stored or restored."""
        name = self.names.get(key)
        if name is None:
            restored = self.restored.get(key)
            if restored is None:
                return None
            name = self.names[restored[0]]
        return self.report.facts.tensor(name)

    def has(self, key: str) -> bool:
        return key in self.names or key in self.restored

    def same_bytes(self, first: TensorFact, second: TensorFact) -> bool:
        return first is second or frozenset((first.name, second.name)) in self.equal

    def relation(self, first: TensorFact, second: TensorFact) -> Relation | None:
        if first is second:
            return Relation.EQUAL
        return self.overlapping.get(frozenset((first.name, second.name)))

    def own_names(self, keys: Iterable[str]) -> tuple[str, ...]:
        return tuple(self.names[k] for k in keys if k in self.names)

    def tie_pairs(self) -> Iterator[tuple[str, str]]:
        """Key pairs that are one memory: names of one view, views over the same bytes, restored names."""
        for view in self.report.facts.tensors:
            for other in view.names[1:]:
                yield self.key_of(view.names[0]), self.key_of(other)
        for names in self.equal:
            first, second = sorted(names)
            yield self.key_of(first), self.key_of(second)
        for missing, (source, _) in self.restored.items():
            yield source, missing

    def overlap_pairs(self) -> Iterator[tuple[str, str, Relation]]:
        """Key pairs of views that share some bytes without being the same bytes."""
        for names, relation in self.overlapping.items():
            if relation is not Relation.EQUAL:
                first, second = sorted(names)
                yield self.key_of(first), self.key_of(second), relation


def _shape(shape: tuple[int, ...]) -> str:
    return str(list(shape))


def compare_reports(
    a: Report,
    b: Report,
    names: NameMap,
    ties: Iterable[tuple[str, str]] = (),
    values: ValueComparer | None = None,
    restoring_a: Iterable[DeclaredTie] = (),
    restoring_b: Iterable[DeclaredTie] = (),
) -> tuple[list[Change], int]:
    """Every difference between A and B that `memlayout diff` reports.

    Args:
        a: The report of the checkpoint before (training's output, the original).
        b: The report of the checkpoint after (the conversion, the deployable copy).
        names: How names are matched.
        ties: Extra declared ties (`--tie TARGET=SOURCE`), by B's names.
        values: Compares two matched tensors' contents (`--deep`); None skips values.
        restoring_a: Ties A declares beyond its facts' own, for names A does not
            store (a model directory's config, asked about B's names).
        restoring_b: The same for B.

    Returns:
        (changes most severe first, number of keys stored or restored on both sides).

    Raises:
        UsageError: two names of one side become one key.
    """
    ties = tuple(ties)
    keys_a = set(keyed((n for t in a.facts.tensors for n in t.names), names.key_in_a, "A"))
    keys_b = set(keyed((n for t in b.facts.tensors for n in t.names), names.key_in_b, "B"))
    side_a = _Side.build(a, "A", names.key_in_a, (), restoring_a, keys_b)
    side_b = _Side.build(b, "B", names.key_in_b, ties, restoring_b, keys_a)
    changes: list[Change] = []
    changes += _membership(side_a, side_b)
    matched_keys = [k for k in side_a.names.keys() | side_a.restored.keys() if side_b.has(k)]
    changes += _attributes(side_a, side_b, sorted(matched_keys), values)
    reported: set[frozenset[str]] = set()
    changes += _ties(side_a, side_b, reported)
    changes += _declared_ties(side_a, side_b, reported)
    changes += _sharing(side_a, side_b, reported)
    changes += _findings(side_a, side_b)
    changes += _bytes(a, b)
    changes.sort(key=lambda c: (-c.severity.rank, _KIND_ORDER[c.kind], c.tensors))
    return changes, len(matched_keys)


def _membership(a: _Side, b: _Side) -> Iterator[Change]:
    for side, other, kind, severity, verb in (
        (a, b, ChangeKind.REMOVED, Severity.WARNING, "only in A"),
        (b, a, ChangeKind.ADDED, Severity.INFO, "only in B"),
    ):
        for view in side.report.facts.tensors:
            keys = tuple(side.key_of(n) for n in view.names if not other.has(side.key_of(n)))
            if not keys:
                continue
            own = side.own_names(keys)
            described = f"{view.dtype}{_shape(view.shape)}, {human_bytes(view.nbytes)}"
            yield Change(
                kind, severity, keys, f"{', '.join(keys)} ({described}) {verb}",
                a_names=own if side is a else (), b_names=own if side is b else (),
            )


def _attributes(a: _Side, b: _Side, keys: list[str], values: ValueComparer | None) -> Iterator[Change]:
    pairs: dict[tuple[str, str], tuple[TensorFact, TensorFact, list[str]]] = {}
    for key in keys:
        av, bv = a.view(key), b.view(key)
        if av is None or bv is None:
            continue
        pairs.setdefault((av.name, bv.name), (av, bv, []))[2].append(key)
    for av, bv, pair_keys in pairs.values():
        yield from _pair_changes(av, bv, tuple(pair_keys), values)


def _pair_changes(av: TensorFact, bv: TensorFact, keys: tuple[str, ...],
                  values: ValueComparer | None) -> Iterator[Change]:
    label = keys[0] if len(keys) == 1 else f"{keys[0]} (and {', '.join(keys[1:])})"
    in_a, in_b = (av.name,), (bv.name,)
    if av.device != bv.device:
        if bv.device == "meta" and av.device != "meta":
            yield Change(
                ChangeKind.DATA_LOST, Severity.ERROR, keys,
                f"{label} is on the meta device in B: it holds no values (it was on {av.device} in A)",
                before=av.device, after=bv.device, a_names=in_a, b_names=in_b,
            )
        else:
            yield Change(
                ChangeKind.DEVICE, Severity.WARNING, keys, f"{label}: device {av.device} -> {bv.device}",
                before=av.device, after=bv.device, a_names=in_a, b_names=in_b,
            )
    compared = values(av, bv) if values is not None else None
    if av.dtype != bv.dtype:
        note = ""
        if compared is not None:
            note = (
                f"; values are A's {compared.how}" if compared.equal
                else f"; {compared.differing} of {compared.elements} values differ from A's {compared.how}"
            )
        yield Change(
            ChangeKind.DTYPE, Severity.WARNING, keys, f"{label}: dtype {av.dtype} -> {bv.dtype}{note}",
            before=av.dtype, after=bv.dtype, a_names=in_a, b_names=in_b,
        )
    if av.shape != bv.shape:
        yield Change(
            ChangeKind.SHAPE, Severity.WARNING, keys, f"{label}: shape {_shape(av.shape)} -> {_shape(bv.shape)}",
            before=_shape(av.shape), after=_shape(bv.shape), a_names=in_a, b_names=in_b,
        )
        return
    if av.contiguous != bv.contiguous:
        became = "became contiguous" if bv.contiguous else "is no longer contiguous"
        yield Change(
            ChangeKind.CONTIGUITY, Severity.INFO if bv.contiguous else Severity.WARNING, keys,
            f"{label} {became}: stride {_shape(av.stride)} -> {_shape(bv.stride)}",
            before=_shape(av.stride), after=_shape(bv.stride), a_names=in_a, b_names=in_b,
        )
    elif av.stride != bv.stride and not av.contiguous:
        # Contiguous tensors may differ in the strides of size-1 dims, which mean nothing.
        yield Change(
            ChangeKind.STRIDE, Severity.INFO, keys,
            f"{label}: stride {_shape(av.stride)} -> {_shape(bv.stride)} ({av.memory_format.value} -> "
            f"{bv.memory_format.value})",
            before=_shape(av.stride), after=_shape(bv.stride), a_names=in_a, b_names=in_b,
        )
    if compared is not None and not compared.equal and av.dtype == bv.dtype:
        worst = "" if compared.max_abs_diff is None else f", largest difference {compared.max_abs_diff:.6g}"
        yield Change(
            ChangeKind.VALUES, Severity.WARNING, keys,
            f"{label}: {compared.differing} of {compared.elements} values changed{worst}",
            before=None, after=None, a_names=in_a, b_names=in_b,
        )


def _ties(a: _Side, b: _Side, reported: set[frozenset[str]]) -> Iterator[Change]:
    for first, second in a.tie_pairs():
        pair = frozenset((first, second))
        if first == second or pair in reported:
            continue
        reported.add(pair)
        keys = (first, second)
        bf, bs = b.view(first), b.view(second)
        in_a, in_b = a.own_names(keys), b.own_names(keys)
        if bf is None and bs is None:
            continue  # both names gone: reported as removed
        if bf is None or bs is None:
            dropped = first if bf is None else second
            yield Change(
                ChangeKind.TIE_LOST, Severity.ERROR, keys,
                f"{first} and {second} are one tensor in A; B drops {dropped} and nothing restores it "
                "(no config, metadata or --tie declares the tie), so a load leaves it missing or freshly initialized",
                a_names=in_a, b_names=in_b,
            )
        elif b.same_bytes(bf, bs):
            for key in keys:
                if key in b.restored:
                    source, declared_by = b.restored[key]
                    yield Change(
                        ChangeKind.TIE_RESTORED, Severity.INFO, keys,
                        f"B stores {source} once; {key} is restored from it by {declared_by}", a_names=in_a,
                        b_names=in_b,
                    )
        else:
            yield Change(
                ChangeKind.TIE_LOST, Severity.ERROR, keys,
                f"{first} and {second} are one tensor in A but separate memory in B "
                f"({where_apart(bf, bs)}): they will train and drift apart",
                a_names=in_a, b_names=in_b,
            )


def _declared_ties(a: _Side, b: _Side, reported: set[frozenset[str]]) -> Iterator[Change]:
    for target, source, declared_by in a.declared + b.declared:
        pair = frozenset((target, source))
        if target == source or pair in reported:
            continue
        bt, bs = b.view(target), b.view(source)
        if bt is None and bs is None:
            continue
        keys = (target, source)
        in_a, in_b = a.own_names(keys), b.own_names(keys)
        if bt is None or bs is None:
            dropped = target if bt is None else source
            reported.add(pair)
            yield Change(
                ChangeKind.DECLARED_TIE_BROKEN, Severity.ERROR, keys,
                f"{target} is declared tied to {source} ({declared_by}); B drops {dropped} and nothing in B restores "
                "it",
                a_names=in_a, b_names=in_b,
            )
        elif not b.same_bytes(bt, bs):
            reported.add(pair)
            at, as_ = a.view(target), a.view(source)
            before = (" (A did not keep it either)"
                      if at is not None and as_ is not None and not a.same_bytes(at, as_) else "")
            yield Change(
                ChangeKind.DECLARED_TIE_BROKEN, Severity.ERROR, keys,
                f"{target} is declared tied to {source} ({declared_by}) but they are separate memory in B "
                f"({where_apart(bt, bs)}){before}",
                a_names=in_a, b_names=in_b,
            )


def _sharing(a: _Side, b: _Side, reported: set[frozenset[str]]) -> Iterator[Change]:
    for first, second, relation in a.overlap_pairs():
        bf, bs = b.view(first), b.view(second)
        if bf is None or bs is None or b.relation(bf, bs) is not None:
            continue
        keys = (first, second)
        yield Change(
            ChangeKind.SHARING_LOST, Severity.INFO, keys,
            f"{first} and {second} share memory in A ({_OVERLAP_WORDS.get(relation, relation.value)}); in B they do "
            "not",
            a_names=a.own_names(keys), b_names=b.own_names(keys),
        )
    gained = [(f, s, Relation.EQUAL) for f, s in b.tie_pairs()] + list(b.overlap_pairs())
    for first, second, relation in gained:
        pair = frozenset((first, second))
        if first == second or pair in reported:
            continue
        reported.add(pair)
        af, as_ = a.view(first), a.view(second)
        if af is None or as_ is None or a.relation(af, as_) is not None:
            continue
        keys = (first, second)
        how = "are one memory" if relation is Relation.EQUAL else f"share memory ({_OVERLAP_WORDS[relation]})"
        yield Change(
            ChangeKind.SHARING_GAINED, Severity.INFO, keys,
            f"{first} and {second} are separate in A and {how} in B",
            a_names=a.own_names(keys), b_names=b.own_names(keys),
        )


def _finding_key(side: _Side, finding: Finding) -> tuple[str, frozenset[str]]:
    return finding.code, frozenset(side.key_of(n) for n in finding.tensors)


def _keys_by_code(side: _Side) -> dict[str, set[str]]:
    """rule code -> every key its findings on this side name."""
    keys: dict[str, set[str]] = {}
    for finding in side.report.findings:
        keys.setdefault(finding.code, set()).update(side.key_of(n) for n in finding.tensors)
    return keys


def _findings(a: _Side, b: _Side) -> Iterator[Change]:
    # A rule may report many tensors in one finding (ML203 names every misaligned
    # tensor of a file), so the same rule on both sides with other tensors is
    # neither wholly new nor wholly resolved. By tensor, then: B's finding is new
    # when it names a tensor A's findings of that rule did not; A's is resolved
    # when a tensor it names is still in B and B's findings of that rule no longer
    # name it. A tensor B does not have is reported as removed, not as resolved.
    in_a = {_finding_key(a, f) for f in a.report.findings}
    in_b = {_finding_key(b, f) for f in b.report.findings}
    keys_a, keys_b = _keys_by_code(a), _keys_by_code(b)
    for finding in b.report.findings:
        code, keys = _finding_key(b, finding)
        if (code, keys) not in in_a and (not keys or not keys <= keys_a.get(code, set())):
            yield Change(
                ChangeKind.FINDING_NEW, finding.severity, tuple(b.key_of(n) for n in finding.tensors),
                f"B has {finding.code} {finding.name}: {finding.message}", b_names=finding.tensors,
            )
    for finding in a.report.findings:
        code, keys = _finding_key(a, finding)
        if (code, keys) in in_b:
            continue
        if not keys or any(b.has(key) and key not in keys_b.get(code, set()) for key in keys):
            yield Change(
                ChangeKind.FINDING_RESOLVED, Severity.INFO, tuple(a.key_of(n) for n in finding.tensors),
                f"A had {finding.code} {finding.name}, B has not: {finding.message}", a_names=finding.tensors,
            )


def _bytes(a: Report, b: Report) -> Iterator[Change]:
    before, after = a.summary.wasted_bytes, b.summary.wasted_bytes
    if before != after:
        grew = after > before
        yield Change(
            ChangeKind.WASTED_BYTES, Severity.WARNING if grew else Severity.INFO, (),
            f"wasted bytes (unused storage plus duplicated contents) {'grew' if grew else 'shrank'} "
            f"by {human_bytes(abs(after - before))}, from {human_bytes(before)} to {human_bytes(after)}",
            before=str(before), after=str(after),
        )
    before, after = a.summary.storage_bytes, b.summary.storage_bytes
    if before != after:
        yield Change(
            ChangeKind.STORAGE_BYTES, Severity.INFO, (),
            # The difference first: padding of a few hundred bytes on MiBs rounds to "16.3 MiB to 16.3 MiB".
            f"storage bytes {'grew' if after > before else 'shrank'} by {human_bytes(abs(after - before))}, "
            f"from {human_bytes(before)} to {human_bytes(after)}",
            before=str(before), after=str(after),
        )
