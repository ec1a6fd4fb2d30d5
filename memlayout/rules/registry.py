"""The rule registry: the single source of each rule's code, name, severity and texts.

`memlayout rules`, `memlayout explain`, SARIF output, the README's rules table and
the documentation site's rule pages all read this. Codes are a contract: users put them in configs and CI.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, NamedTuple

from memlayout.severity import Severity

if TYPE_CHECKING:
    from memlayout.core.content import ContentReader
    from memlayout.core.facts import Facts
    from memlayout.rules.pickle_dangers import JudgedGlobal

FINGERPRINT_SCHEME = 2
"""How `Finding.fingerprint` is made. 1: the rule code and the sorted tensor names. 2: those, and
`Finding.subject` where a rule gives one (ML601's globals, ML602's format, ML603's other formats);
a finding with no subject fingerprints as under scheme 1."""


class Finding(NamedTuple):
    """One problem: flat, like a linter's violation.

    A NamedTuple, as the per-tensor records are: a checkpoint of 40,000 transposed
    weights has 40,000 ML201 findings.
    """

    code: str
    """"ML101" and so on."""
    name: str
    """The rule's kebab-case name."""
    severity: Severity
    tensors: tuple[str, ...]
    """The tensors involved, by the name facts cite."""
    message: str
    """What is wrong, naming the tensors."""
    hint: str
    """How to fix it."""
    storage: str | None = None
    """The storage involved, when there is one."""
    wasted_bytes: int = 0
    """Bytes this finding costs on disk or in memory (bloat, duplicates)."""
    subject: tuple[str, ...] = ()
    """What the finding is about besides its tensors, which its fingerprint covers: ML601's globals
    with their danger classes, ML603's other formats. Empty where the tensors say it all."""
    pickle_globals: tuple[JudgedGlobal, ...] = ()
    """ML601: every global the file's pickles name, each with its danger class."""

    @property
    def fingerprint(self) -> str:
        """Stable across runs and tensor order, for SARIF and baselines; changes when what it warns about does.

        The rule code, the sorted tensor names and the sorted `subject`: a pickle that
        names one more global, or a polyglot valid as one more format, is a new finding
        that no baseline recorded.
        """
        text = "\0".join([self.code, *sorted(self.tensors)])
        if self.subject:
            # Two NULs: no tensor name list can end where a subject begins.
            text += "\0\0" + "\0".join(sorted(self.subject))
        return _digest(text)

    @property
    def fingerprint_v1(self) -> str:
        """The fingerprint under scheme 1 (rule and tensors only), as baselines before scheme 2 recorded it."""
        return _digest("\0".join([self.code, *sorted(self.tensors)]))


def _digest(text: str) -> str:
    import hashlib  # only reporters that name findings stably need it (SARIF, baselines)

    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Requirement(str, enum.Enum):
    """What a rule reads that some sources do not record."""

    LAYOUT = "layout"
    """The real storages, strides, offsets and devices (DCP metadata records none)."""
    SHARING = "sharing"
    """Which names read the same bytes: real storages, or the stored chunks a checkpoint kept in
    pieces lists (DCP metadata records them, where it records no layout)."""
    CONTENT = "content"
    """The tensors' bytes (a bare pickle or metadata-only source has none to read)."""


@dataclass(frozen=True)
class SkippedRule:
    """A selected rule that did not run because the source lacks what it reads."""

    code: str
    name: str
    reason: str
    """What the source does not record, in words."""


@dataclass(frozen=True)
class RuleConfig:
    """Knobs the rules read."""

    deep: bool = False
    """Read every tensor's contents (ML503, full-content ML102)."""
    min_duplicate_bytes: int = 4096
    """ML102 ignores tensors smaller than this."""
    min_bloat_bytes: int = 1024
    """ML301 ignores storages wasting less than this."""
    fragmented_min_storages: int = 4
    """ML204 stays quiet below this many parameter storages."""
    min_shard_padding_bytes: int = 1024 * 1024
    """ML303 ignores parameters whose shards are padded by fewer bytes, over all ranks."""
    ties: tuple[tuple[str, str], ...] = ()
    """Extra declared ties from `--tie a=b`."""
    alignment: int | None = None
    """ML203's boundary, in bytes (a power of two), when the project asks for one (`alignment` in
    `[tool.memlayout]`, `flatten --align`); None judges each tensor by what its format gives."""


@dataclass
class RuleContext:
    """What a rule check receives."""

    facts: Facts
    config: RuleConfig
    content: ContentReader | None = None
    """None when the source holds no readable data (metadata only, meta tensors)."""
    progress: Callable[[str, int, int], None] | None = None
    """Called as (task, done, total) by long content scans; the CLI draws a bar."""


Check = Callable[[RuleContext], Iterable[Finding]]


class RuleExample(NamedTuple):
    """A small reproduction of a rule's finding and of its fix, run by the tests."""

    setup: str
    """Python that writes the checkpoint `command` reads (`model.pt` in the working directory)."""
    command: str
    """The `memlayout inspect ...` line that reports the finding."""
    fixed: str
    """Python, run after `setup` in the same namespace, that rewrites the checkpoint with the fix."""


@dataclass(frozen=True)
class Rule:
    """One rule: its contract fields, its documentation and its check.

    The documentation here is the only copy: `memlayout explain`, SARIF's rule help
    and the site's page for each rule are all rendered from it
    (`memlayout.report.rule_docs`).
    """

    code: str
    name: str
    severity: Severity
    summary: str
    """One line: when it fires."""
    explanation: str
    """Why it matters: the real failure it causes."""
    hint: str
    """How to fix it, as findings print it."""
    check: Check = field(repr=False, compare=False)
    deep_only: bool = False
    """Runs only with --deep (reads every value)."""
    needs: frozenset[Requirement] = frozenset()
    """What the rule reads beyond names, dtypes and shapes; without it the rule is skipped."""
    detects: str = ""
    """What it detects, exactly: the condition, its thresholds and what is left out."""
    example: RuleExample | None = None
    """A small checkpoint that triggers it, and the same checkpoint fixed."""

    @property
    def family(self) -> str:
        """The rule family its code's hundreds digit names ("aliasing" for ML1xx, ...)."""
        return FAMILIES[self.code[:3]]

    @property
    def tags(self) -> tuple[str, ...]:
        """Labels for dashboards (SARIF `properties.tags`)."""
        return (self.family, "security") if self.family == "safety" else (self.family,)

    @property
    def full_description(self) -> str:
        """What it detects and why it matters, as one paragraph of plain text."""
        return " ".join(f"{self.detects} {self.explanation}".split())

    def finding(
        self,
        tensors: Iterable[str],
        message: str,
        *,
        storage: str | None = None,
        wasted_bytes: int = 0,
        hint: str | None = None,
        severity: Severity | None = None,
        subject: Iterable[str] = (),
        pickle_globals: Iterable[JudgedGlobal] = (),
    ) -> Finding:
        """A finding of this rule, with the rule's default severity and hint unless given."""
        # Positional, in Finding's field order: one per finding of a rule's check.
        return Finding(
            self.code, self.name, severity or self.severity, tuple(tensors), message, hint or self.hint, storage,
            wasted_bytes, tuple(subject), tuple(pickle_globals),
        )


RULES: dict[str, Rule] = {}

FAMILIES = {
    "ML1": "aliasing",
    "ML2": "layout",
    "ML3": "waste",
    "ML4": "rnn",
    "ML5": "dtype-device",
    "ML6": "safety",
}
"""Each code's hundreds digit names its family, as the rule modules are split."""


def rule(
    code: str,
    name: str,
    severity: Severity,
    summary: str,
    hint: str,
    explanation: str,
    deep_only: bool = False,
    needs: Iterable[Requirement] = (),
    *,
    detects: str = "",
    example: RuleExample | None = None,
) -> Callable[[Check], Rule]:
    """Register a check function as a rule. Family modules decorate their checks with this.

    `summary`, `detects`, `explanation` (why it matters), `example` and `hint` (how
    to fix it) are the rule's whole documentation; a test requires every part.
    """

    def register(check: Check) -> Rule:
        if code in RULES:
            raise RuntimeError(f"rule code {code} registered twice")
        registered = Rule(
            code, name, severity, summary, explanation.strip(), hint, check, deep_only, frozenset(needs),
            " ".join(detects.split()),
            None if example is None else RuleExample(example.setup.strip(), example.command, example.fixed.strip()),
        )
        RULES[code] = registered
        return registered

    return register


def _longest_prefix(code: str, prefixes: Iterable[str]) -> int:
    return max((len(p) for p in prefixes if code.startswith(p.upper())), default=-1)


def is_selected(code: str, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> bool:
    """flake8's decision: the more specific of the matching select and ignore prefixes wins.

    With no select, every code is selected (as if `--select ML`). A tie goes to ignore.
    """
    select = list(select) or ["ML"]
    selected = _longest_prefix(code, select)
    ignored = _longest_prefix(code, ignore)
    return selected >= 0 and selected > ignored


def is_ignored_for_its_tensors(finding: Finding, per_tensor_ignores: Iterable[tuple[str, Iterable[str]]]) -> bool:
    """Whether `per-tensor-ignores` drops `finding`: every tensor it names matches a glob
    that lists its code (or a prefix of it). A finding that names no tensor is kept.

    Globs are `fnmatch` patterns on the dotted names, so `*.running_mean` matches
    `bn.running_mean` and `layer1.0.bn.running_mean`.
    """
    pairs = [(glob, tuple(c.upper() for c in codes)) for glob, codes in per_tensor_ignores]
    if not finding.tensors or not pairs:
        return False
    return all(
        any(fnmatchcase(tensor, glob) and finding.code.startswith(codes) for glob, codes in pairs)
        for tensor in finding.tensors
    )
