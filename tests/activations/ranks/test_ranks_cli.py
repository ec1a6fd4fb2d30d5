"""`memlayout activations --world-size N --fsdp` on the command line: the report, the plan, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests.activations.sharded_models import BATCH_SPECS

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
UNEVEN = "tests.activations.sharded_models:llama_style"
EVEN = "tests.activations.sharded_models:llama_style_even"
INPUTS = [arg for spec in BATCH_SPECS for arg in ("--input", spec)]
KINDS = ("parameter_bytes", "buffer_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "temporary_bytes",
         "input_bytes", "communication_bytes")


def run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["activations", *args])
    return result.exit_code, result.stdout, result.stderr


def predict(target: str, *flags: str) -> dict:
    code, out, err = run([target, *INPUTS, "--format", "json", *flags])
    assert code == 0, err
    report: dict = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    return report


def test_each_rank_layout_is_reported_and_its_kinds_add_up_to_its_peak() -> None:
    report = predict(UNEVEN, "--world-size", "2", "--fsdp")
    ranks = report["ranks"]
    # The MLP width (341) is odd: rank 0 holds one more row of each MLP projection.
    assert [r["rank"] for r in ranks] == [0, 1] and [r["same_layout"] for r in ranks] == [[[0, 0]], [[1, 1]]]
    assert ranks[0]["shard_bytes"] > ranks[1]["shard_bytes"] and ranks[0]["peak_bytes"] > ranks[1]["peak_bytes"]
    for rank in ranks:
        assert sum(rank[kind] for kind in KINDS) == rank["peak_bytes"]
        assert sum(rank["tracker"].values()) == rank["peak_bytes"]
        # AdamW: two moments per shard element, and a float32 step count per parameter (39 of them).
        assert rank["optimizer_bytes"] == 2 * rank["shard_bytes"] + 4 * 39
    assert report["summary"]["peak_bytes"] == max(r["peak_bytes"] for r in ranks) and report["summary"]["rank"] == 0
    distributed = report["distributed"]
    assert distributed["wrapped_modules"] == ["layers.0", "layers.1", "layers.2", "layers.3", ""]
    assert distributed["world_size"] == 2 and distributed["tp"] == 1 and distributed["layouts"] == 2
    assert "def shard(model" in distributed["code"]


def test_an_even_model_is_one_layout_and_tensor_parallel_splits_it() -> None:
    plain = predict(EVEN, "--world-size", "4", "--fsdp")
    assert [r["same_layout"] for r in plain["ranks"]] == [[[0, 3]]]
    both = predict(EVEN, "--world-size", "4", "--fsdp", "--tp", "2")
    styles = {(s["module"], s["style"]) for s in both["distributed"]["tensor_parallel"]}
    assert ("layers.0.self_attn.q_proj", "colwise") in styles and ("layers.3.mlp.down_proj", "rowwise") in styles
    assert len(styles) == 4 * 7
    assert both["distributed"]["data_parallel"] == 2
    # Each rank computes half the heads and half the MLP: fewer activations than FSDP over 4 alone.
    assert both["ranks"][0]["activation_bytes"] < plain["ranks"][0]["activation_bytes"]
    assert both["ranks"][0]["forward_flops"] < plain["ranks"][0]["forward_flops"]


def test_keeping_blocks_gathered_costs_their_parameters_and_a_plan_reshards_them() -> None:
    resharded = predict(UNEVEN, "--world-size", "2", "--fsdp")["summary"]["peak_bytes"]
    report = predict(UNEVEN, "--world-size", "2", "--fsdp", "--no-reshard-after-forward", "--budget", str(resharded))
    assert report["summary"]["peak_bytes"] > resharded
    assert not any(report["distributed"]["reshard_after_forward"].values())
    plan = report["plan"]
    assert plan["peak_bytes"] <= resharded and plan["reshard_after_forward"] and not plan["checkpoint"]
    # The last block's backward comes first, right after forward: resharding it frees nothing.
    assert "layers.3" not in plan["reshard_after_forward"]
    assert "reshard_after_forward=True" in plan["code"]


def test_a_budget_below_every_reshard_is_met_by_checkpointing(tmp_path: Path) -> None:
    peak = predict(UNEVEN, "--world-size", "2", "--fsdp")["summary"]["peak_bytes"]
    budget = int(peak * 0.8)
    target = tmp_path / "report.json"
    code, out, err = run([UNEVEN, *INPUTS, "--world-size", "2", "--fsdp", "--budget", str(budget), "--format", "json",
                          "-o", str(target)])
    assert code == 0 and out == "", err
    report = json.loads(target.read_text())
    jsonschema.validate(report, SCHEMA)
    plan = report["plan"]
    assert plan["checkpoint"] and all(r["peak_bytes"] <= budget for r in plan["ranks"])
    assert [r["rank"] for r in plan["ranks"]] == [0, 1]
    assert "functools.partial(checkpoint, module.forward, use_reentrant=False)" in plan["code"]
    assert plan["recompute_flops"] > 0


def test_an_unreachable_budget_exits_1_with_the_lowest_peak() -> None:
    code, out, err = run([UNEVEN, *INPUTS, "--world-size", "2", "--fsdp", "--budget", "4MiB"])
    assert code == 1 and out == ""
    assert err.startswith("memlayout: error: no plan fits the largest rank in 4.0 MiB") and err.count("\n") == 1
    assert "--allow-offload" in err


def test_the_table_shows_each_rank_and_the_code() -> None:
    code, out, err = run([UNEVEN, *INPUTS, "--world-size", "2", "--fsdp", "--param-dtype", "bfloat16"])
    assert code == 0, err
    assert "on 2 ranks" in out and "each rank at its peak" in out
    assert "mixed precision" in out and "MixedPrecisionPolicy(param_dtype=torch.bfloat16)" in out
    assert "def shard(model" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([UNEVEN, "--world-size", "2", "--fsdp", "--tp", "2"], "--tp 2 does not divide layers.0.mlp.gate_proj's 341"),
        ([EVEN, "--world-size", "6", "--fsdp", "--tp", "4"], "--tp 4 does not divide --world-size 6"),
        (["tests.activations.sharded_models:conv_net", "--world-size", "2", "--fsdp", "--tp", "2"],
         "--tp found no attention or MLP projections to shard in ConvNet"),
        ([EVEN, "--fsdp"], "--fsdp needs --world-size N"),
        ([EVEN, "--world-size", "2"], "--world-size needs --fsdp"),
        ([EVEN, "--world-size", "2", "--fsdp", "--real"], "--world-size predicts ranks on fake tensors"),
        ([EVEN, "--world-size", "2", "--fsdp", "--fsdp-modules", "blocks.*"],
         "--fsdp-modules 'blocks.*' matches no module"),
        ([EVEN, "--world-size", "2", "--fsdp", "--param-dtype", "int8"], "--param-dtype 'int8' is not a dtype"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out, err = run([*args, *INPUTS])
    assert code == 2 and out == ""
    assert err.startswith(f"memlayout: error: {message}") and err.count("\n") == 1, err


def test_fsdp_modules_by_path_or_class_wrap_the_same_blocks() -> None:
    by_path = predict(EVEN, "--world-size", "2", "--fsdp", "--fsdp-modules", "layers.*")
    by_class = predict(EVEN, "--world-size", "2", "--fsdp", "--fsdp-modules", "Block")
    assert by_path["distributed"]["wrapped_modules"] == by_class["distributed"]["wrapped_modules"] == [
        "layers.0", "layers.1", "layers.2", "layers.3", ""]
    mlps = predict(EVEN, "--world-size", "2", "--fsdp", "--fsdp-modules", "layers.*.mlp")
    assert mlps["distributed"]["wrapped_modules"][:2] == ["layers.0.mlp", "layers.1.mlp"]
    # Whole blocks gathered one at a time hold less than a gather of everything but the MLPs.
    assert by_path["summary"]["peak_bytes"] < mlps["summary"]["peak_bytes"]
