"""Without torch: inspect, diff, rules and explain read files in every report format;
what runs torch exits 2 with one line naming the extra to install.

Every command runs in a fresh process (see conftest.py for how torch is absent).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource

import memlayout
from memlayout.cli.formats import Command, formats_for
from tests.core_install.conftest import REPO, core_install
from tests.core_install.conftest import memlayout as run
from tests.remote.nginx import Server, start_nginx

# One checkpoint of each format the loaders read, as the real writers made them.
CHECKPOINTS = (
    "module.pt", "model.safetensors", "gpt2-sharded", "gpt2-bin", "dcp", "scripted.pt", "model.pt2",
    "legacy_state_dict.pt", "legacy_tar_state_dict.pt", "legacy_tar_module.pt",
)
NO_FINDINGS = {"dcp", "gpt2-sharded"}
"""No annotation names these: DCP records no layout, and save_pretrained's safetensors shards are laid out as
safetensors' own writer lays them out (ML203 judges them by that standard)."""
DATA_FILES = ("gpt2-sharded/generation_config.json",)
"""Files of the model folders that hold no pickle and no checkpoint: each is an entry of its own, as data."""
EXTRA = "pip install 'memlayout[torch]'"
SCHEMAS = Path(memlayout.__file__).parent / "report"
SARIF_SCHEMA = REPO / "tests" / "report" / "sarif-schema-2.1.0.json"


def validate(schema_path: Path, data: object, *also: Path) -> None:
    schema = json.loads(schema_path.read_text())
    registry: Registry = Registry()
    for other in also:
        contents = json.loads(other.read_text())
        registry = registry.with_resource(contents["$id"], Resource.from_contents(contents))
    jsonschema.validators.validator_for(schema)(schema, registry=registry).validate(data)


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("memlayout: error: "), stderr
    return lines[0]


def test_this_install_has_no_torch() -> None:
    if not core_install():
        pytest.skip("only the install without torch can show it: make test-core")
    for name in ("torch", "safetensors", "isal"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed, though memlayout does not depend on it"


@pytest.mark.parametrize("fmt", [f.value for f in formats_for(Command.INSPECT)])
def test_inspect_reads_every_checkpoint_format_in_each_report_format(checkpoints: Path, fmt: str) -> None:
    paths = [checkpoints / name for name in CHECKPOINTS]
    done = run("inspect", *paths, "--format", fmt, "--fail-on", "never")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    if fmt == "json":
        data = json.loads(out)
        validate(SCHEMAS / "schema_v2.json", data, SCHEMAS / "schema_v1.json")
        errors = [p["error"] for p in data["reports"] if p["error"] is not None]
        assert len(data["reports"]) == len(CHECKPOINTS) + len(DATA_FILES) and errors == [], errors
        assert [p["path"] for p in data["reports"] if p["data"]] == [str(checkpoints / f) for f in DATA_FILES]
    elif fmt == "jsonl":
        lines = [json.loads(line) for line in out.splitlines()]
        for line in lines:
            validate(SCHEMAS / "schema_jsonl_v1.json", line, SCHEMAS / "schema_v1.json")
        assert sorted(line["path"] for line in lines) == sorted(str(checkpoints / name)
                                                                for name in (*CHECKPOINTS, *DATA_FILES))
        assert [line["error"] for line in lines if line["error"] is not None] == []
    elif fmt == "sarif":
        validate(SARIF_SCHEMA, json.loads(out))
    elif fmt == "junit":
        suites = ET.fromstring(out)
        assert len(suites.findall("testsuite")) == len(CHECKPOINTS) + len(DATA_FILES)
    elif fmt == "html":
        assert out.startswith("<!doctype html>") and all(name in out for name in CHECKPOINTS if name != "dcp")
    elif fmt == "github":
        # Workflow commands, and a line for each rule a source cannot answer (DCP records no storages).
        assert all(line.startswith(("::", "memlayout: ")) for line in out.splitlines()), out
        # A folder's findings are annotated on the file that holds them.
        assert all(f"{name}," in out or f"{name}/" in out for name in CHECKPOINTS if name not in NO_FINDINGS), out
    elif fmt == "markdown":
        assert all(name in out for name in CHECKPOINTS if name not in NO_FINDINGS - {"dcp"}), out
    else:  # table
        assert all(name in out for name in CHECKPOINTS), out


def test_inspect_deep_with_the_html_map(checkpoints: Path, tmp_path: Path) -> None:
    page = tmp_path / "map.html"
    done = run("inspect", checkpoints / "module.pt", "--deep", "--html", page, "--format", "json")
    assert done.returncode == 1, done.stderr  # module.pt has findings at the default --fail-on
    assert json.loads(done.stdout)["findings"]
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "embed.weight" in html


@pytest.mark.parametrize("fmt", [f.value for f in formats_for(Command.DIFF)])
def test_diff_compares_two_formats_in_each_diff_format(checkpoints: Path, fmt: str) -> None:
    done = run("diff", checkpoints / "module.pt", checkpoints / "model.safetensors", "--format", fmt,
               "--fail-on", "never")
    assert done.returncode == 0, done.stderr
    if fmt == "json":
        validate(Path(memlayout.__file__).parent / "diff" / "schema_v1.json", json.loads(done.stdout))
    elif fmt == "html":
        assert done.stdout.startswith("<!doctype html>") and "model.safetensors" in done.stdout
    else:
        assert "head.weight" in done.stdout  # the tie the safetensors file no longer holds


def test_diff_with_its_html_page(checkpoints: Path, tmp_path: Path) -> None:
    page = tmp_path / "diff.html"
    done = run("diff", checkpoints / "module.pt", checkpoints / "legacy_state_dict.pt", "--html", page,
               "--fail-on", "never")
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "legacy_state_dict.pt" in html


def test_rules_and_explain() -> None:
    rules = run("rules")
    assert rules.returncode == 0 and "ML101" in rules.stdout, rules.stderr
    explain = run("explain", "ML201")
    assert explain.returncode == 0 and "ML201" in explain.stdout, explain.stderr


def test_flatten_check_needs_no_torch(checkpoints: Path) -> None:
    paths = (checkpoints / "model.safetensors", checkpoints / "legacy_state_dict.pt")
    done = run("flatten", "--check", *paths)
    # Neither is flat yet, but what flatten would fix in them is info: below the default --fail-on.
    assert done.returncode == 0, done.stderr
    assert (done.stdout.count(": passes (") == 2
            and done.stdout.count("flatten would still rewrite it") == 2), done.stdout
    done = run("flatten", "--check", *paths, "--fail-on", "info")
    assert done.returncode == 1, done.stderr
    assert done.stdout.count(": would change (") == 2, done.stdout


def test_flatten_writing_out_names_the_extra_and_writes_nothing(checkpoints: Path, tmp_path: Path) -> None:
    out = tmp_path / "flat.safetensors"
    done = run("flatten", checkpoints / "model.safetensors", "-o", out)
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        f"memlayout: error: flatten, except --check, needs torch, which is not installed (install it with: {EXTRA})"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "tests.models:fragmented_mlp"),
        ("diff", "fixtures/demo_checkpoint.pt", "tests.models:fragmented_mlp"),
        ("flatten", "--check", "tests.models:fragmented_mlp"),
        ("activations", "fixtures.activation_models:cnn", "--input", "float32[2,3,8,8]"),
    ],
    ids=["inspect-spec", "diff-spec", "flatten-spec", "activations"],
)
def test_what_runs_torch_exits_2_with_one_line_naming_the_extra(args: tuple[str, ...]) -> None:
    done = run(*args)
    assert done.returncode == 2, done.stdout
    line = one_error_line(done.stderr)
    assert "needs torch, which is not installed" in line and line.endswith(f"(install it with: {EXTRA})"), line
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start_nginx(tmp_path_factory.mktemp("nginx"))


def test_remote_reads_need_no_torch(checkpoints: Path, nginx: Server) -> None:
    # A safetensors file, a torch.save zip and a sharded directory over HTTP from a real
    # nginx, with torch unimportable: the same tensors as from disk.
    shutil.copytree(checkpoints / "gpt2-sharded", nginx.root / "files" / "gpt2-sharded")
    for name in ("model.safetensors", "module.pt"):
        shutil.copyfile(checkpoints / name, nginx.root / "files" / name)
    index = next(p.name for p in (checkpoints / "gpt2-sharded").glob("*.index.json"))
    for local, url in (
        (checkpoints / "model.safetensors", f"{nginx.url}/files/model.safetensors"),
        (checkpoints / "module.pt", f"{nginx.url}/files/module.pt"),
        (checkpoints / "gpt2-sharded", f"{nginx.url}/files/gpt2-sharded/{index}"),
    ):
        on_disk = run("inspect", "--format", "json", "--fail-on", "never", local)
        remote = run("inspect", "--format", "json", "--fail-on", "never", url)
        assert remote.returncode == 0, remote.stderr
        assert json.loads(remote.stdout)["tensors"] == json.loads(on_disk.stdout)["tensors"]
        assert any(n.startswith("read remotely") for n in json.loads(remote.stdout)["source"]["notes"])
