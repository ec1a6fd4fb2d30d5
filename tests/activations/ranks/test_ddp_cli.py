"""`memlayout activations --world-size N --ddp` on the command line: the report, its buckets, one-line errors.

The figures themselves are checked against real gloo ranks in test_ddp_real.py; these run
fake ranks only, on small models.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from memlayout.activations.ranks.ddp import MIB, DdpOptions
from memlayout.cli.app import app
from tests.activations.sharded_models import SHORT_TOKEN_SPECS

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
LLAMA = "tests.activations.sharded_models:llama_style"
CONV = "tests.activations.sharded_models:conv_net"
TOKENS = [arg for spec in SHORT_TOKEN_SPECS for arg in ("--input", spec)]
IMAGES = ["--input", "float32[2,3,8,8]"]
KINDS = ("parameter_bytes", "buffer_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "temporary_bytes",
         "input_bytes", "communication_bytes")


def run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["activations", *args])
    return result.exit_code, result.stdout, result.stderr


def predict(*args: str) -> dict:
    code, out, err = run([*args, "--format", "json"])
    assert code == 0, err
    report: dict = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    return report


def test_the_report_gives_the_buckets_and_the_kinds_add_up_to_the_peak() -> None:
    report = predict(LLAMA, *TOKENS, "--world-size", "2", "--ddp", "--bucket-cap-mb", "1")
    (rank,) = report["ranks"]
    assert rank["same_layout"] == [[0, 1]] and sum(rank[kind] for kind in KINDS) == rank["peak_bytes"]
    distributed = report["distributed"]
    assert distributed["fsdp"] is False and distributed["data_parallel"] == 2 and distributed["wrapped_modules"] == []
    ddp = distributed["ddp"]
    # Every rank holds the whole model; the buckets hold every trainable parameter's gradient once.
    assert rank["shard_bytes"] == ddp["bucket_bytes"] == sum(b["bytes"] for b in ddp["buckets"])
    assert [b["index"] for b in ddp["buckets"]] == list(range(len(ddp["buckets"]))) and len(ddp["buckets"]) == 4
    assert sum(b["parameters"] for b in ddp["buckets"]) == 39
    # A bucket closes once it reaches the cap: all but the last reach 1 MiB, none holds two caps' worth.
    assert all(MIB <= b["bytes"] < 2 * MIB for b in ddp["buckets"][:-1]) and ddp["buckets"][-1]["bytes"] < MIB
    assert ddp["first_bucket_cap_bytes"] == ddp["bucket_cap_bytes"] == MIB and ddp["bucket_cap_mb"] == 1
    # The buckets are alive at the peak, and AdamW's two moments follow the whole model.
    assert rank["communication_bytes"] == ddp["bucket_bytes"]
    assert rank["optimizer_bytes"] == 2 * rank["shard_bytes"] + 4 * 39
    assert "def wrap(model):" in distributed["code"]
    assert "return DistributedDataParallel(model, bucket_cap_mb=1)" in distributed["code"]


def test_gradients_as_bucket_views_are_not_counted_twice() -> None:
    beside = predict(LLAMA, *TOKENS, "--world-size", "2", "--ddp")
    views = predict(LLAMA, *TOKENS, "--world-size", "2", "--ddp", "--gradient-as-bucket-view")
    assert views["distributed"]["ddp"]["gradient_as_bucket_view"] is True
    assert "gradient_as_bucket_view=True" in views["distributed"]["code"]
    # 1 x 16 tokens: the peak is the optimizer's step, where the gradients beside the buckets are a whole model more.
    assert beside["ranks"][0]["peak_at"]["phase"] == "optimizer"
    assert beside["ranks"][0]["gradient_bytes"] == beside["ranks"][0]["shard_bytes"]
    assert views["ranks"][0]["gradient_bytes"] == 0
    assert views["summary"]["peak_bytes"] < beside["summary"]["peak_bytes"]


def test_without_a_cap_the_buckets_follow_ddps_defaults() -> None:
    report = predict(LLAMA, *TOKENS, "--world-size", "2", "--ddp")
    ddp = report["distributed"]["ddp"]
    assert ddp["bucket_cap_mb"] is None and (ddp["first_bucket_cap_bytes"], ddp["bucket_cap_bytes"]) == (MIB, 25 * MIB)
    # The first bucket closes at 1 MiB; the rest of the 3.7 MiB model fits the second.
    assert len(ddp["buckets"]) == 2 and MIB <= ddp["buckets"][0]["bytes"] < 2 * MIB
    assert "return DistributedDataParallel(model)" in report["distributed"]["code"]


def test_the_caps_are_the_ones_ddp_computes() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from memlayout import _torch

    dist.init_process_group("fake", store=_torch.FakeStore(), rank=0, world_size=2)
    try:
        for options in (DdpOptions(), DdpOptions(bucket_cap_mb=2.5), DdpOptions(bucket_cap_mb=0.25)):
            wrapped = DistributedDataParallel(torch.nn.Linear(2, 2), bucket_cap_mb=options.bucket_cap_mb)
            config = wrapped._bucket_config
            assert options.caps() == (config.first_bucket_bytes_cap, config.bucket_bytes_cap), options
    finally:
        dist.destroy_process_group()


def test_the_table_shows_the_buckets_and_the_code() -> None:
    code, out, err = run([LLAMA, *TOKENS, "--world-size", "2", "--ddp", "--bucket-cap-mb", "1"])
    assert code == 0, err
    assert "on 2 ranks" in out and "DDP over 2 ranks" in out
    assert "gradient buckets   4 buckets, 3.7 MiB in all (1.1 MiB, 1.1 MiB, 1.0 MiB, 500.5 KiB)" in out
    assert "1.0 MiB each (bucket_cap_mb=1)" in out and "comms: DDP's gradient buckets" in out
    assert "def wrap(model):" in out and "FSDPMemTracker" not in out


def test_a_budget_the_step_fits_needs_no_plan() -> None:
    peak = predict(LLAMA, *TOKENS, "--world-size", "2", "--ddp")["summary"]["peak_bytes"]
    fits = predict(LLAMA, *TOKENS, "--world-size", "2", "--ddp", "--budget", str(peak))
    assert fits["plan"]["checkpoint"] == [] and fits["plan"]["peak_bytes"] == peak


def test_an_unreachable_budget_exits_1_and_its_hints_lower_the_peak() -> None:
    ddp = [CONV, *IMAGES, "--world-size", "2"]
    peak = predict(*ddp, "--ddp")["summary"]["peak_bytes"]
    code, out, err = run([*ddp, "--ddp", "--budget", "64KiB"])
    assert code == 1 and out == ""
    assert err.startswith("memlayout: error: no plan fits the largest rank in 64.0 KiB") and err.count("\n") == 1, err
    # Every DDP rank holds the whole model: more ranks and CPU offload lower nothing, and are not offered.
    assert "--gradient-as-bucket-view" in err and "--fsdp" in err
    assert "--allow-offload" not in err and "--world-size" not in err
    views = predict(*ddp, "--ddp", "--gradient-as-bucket-view")["summary"]["peak_bytes"]
    sharded = predict(*ddp, "--fsdp", "--fsdp-modules", "blocks.*")["summary"]["peak_bytes"]
    assert views < peak and sharded < peak


# (arguments, the error's first words, the arguments its hint leads to)
DDP_NOT_ON_GPU = "--gpu traces FSDP2's ranks for a GPU, and --ddp's ranks are traced for the CPU"

ERRORS = [
    ([CONV, *IMAGES, "--ddp"], "--ddp needs --world-size N", [CONV, *IMAGES, "--world-size", "8", "--ddp"]),
    ([CONV, *IMAGES, "--bucket-cap-mb", "1"], "--bucket-cap-mb needs --world-size N",
     [CONV, *IMAGES, "--world-size", "8", "--ddp", "--bucket-cap-mb", "1"]),
    ([CONV, *IMAGES, "--world-size", "2"], "--world-size needs --fsdp or --ddp",
     [CONV, *IMAGES, "--world-size", "2", "--ddp"]),
    ([CONV, *IMAGES, "--world-size", "2", "--fsdp", "--gradient-as-bucket-view"],
     "--gradient-as-bucket-view is DDP's, and the ranks are FSDP2's",
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--gradient-as-bucket-view"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--fsdp-modules", "blocks.*"],
     "--fsdp-modules is FSDP2's, and the ranks are DistributedDataParallel's",
     [CONV, *IMAGES, "--world-size", "2", "--fsdp", "--fsdp-modules", "blocks.*"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--allow-offload"], "--allow-offload is FSDP2's",
     [CONV, *IMAGES, "--world-size", "2", "--ddp"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--fsdp"], "--ddp replicates the model on every rank, and --fsdp",
     [CONV, *IMAGES, "--world-size", "2", "--ddp"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--tp", "2"], "--ddp replicates the model on every rank, and --tp",
     [CONV, *IMAGES, "--world-size", "2", "--ddp"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--bucket-cap-mb", "0"], "--bucket-cap-mb 0 is not a bucket size",
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--bucket-cap-mb", "0.5"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--bucket-cap-mb", "nan"], "Invalid value for '--bucket-cap-mb'",
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--bucket-cap-mb", "0.5"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--gpu", "h100"], DDP_NOT_ON_GPU,
     [CONV, *IMAGES, "--world-size", "2", "--ddp"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--gpu", "h100", "--fit", "batch", "--budget", "4MiB"],
     DDP_NOT_ON_GPU,
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--fit", "batch", "--budget", "4MiB"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--clip-grad-norm", "abc"], "Invalid value for '--clip-grad-norm'",
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--clip-grad-norm", "1.0"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--clip-grad-norm", "nan"], "Invalid value for '--clip-grad-norm'",
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--clip-grad-norm", "1.0"]),
    ([CONV, *IMAGES, "--world-size", "2", "--ddp", "--device", "meta"], "--world-size predicts ranks on fake tensors",
     [CONV, *IMAGES, "--world-size", "2", "--ddp", "--device", "cpu"]),
]


@pytest.mark.parametrize(("args", "message", "followed"), ERRORS, ids=[e[1].split(",")[0] for e in ERRORS])
def test_bad_input_is_one_line_and_exit_2_and_its_hint_leads_to_a_report(
    args: list[str], message: str, followed: list[str],
) -> None:
    code, out, err = run(args)
    assert code == 2 and out == ""
    assert err.startswith(f"memlayout: error: {message}") and err.count("\n") == 1, err
    code, out, err = run([*followed, "--format", "json"])
    assert code == 0, err
    jsonschema.validate(json.loads(out), SCHEMA)


def test_ddp_on_a_gpu_is_refused_in_one_line_with_the_cpu_prediction_as_the_hint() -> None:
    from memlayout.activations.ranks import analyze_ranks
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.errors import UsageError

    options = ShardingOptions(world_size=2, fsdp=False, ddp=DdpOptions())
    with pytest.raises(UsageError) as refused:
        analyze_ranks(CONV, ["float32[2,3,8,8]"], sharding=options, device="cuda")
    # the settings, as Python names them
    assert "`ddp` is traced for `device=cpu`, not cuda" in refused.value.one_line()
    assert "predict `device=cpu`" in refused.value.one_line()
    assert analyze_ranks(CONV, ["float32[2,3,8,8]"], sharding=options, device="cpu").ddp is not None


def test_the_buckets_ddp_rebuilds_are_fake_whatever_their_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake CPU step keeps a small tensor made from nothing real (a mask): the Reducer's buckets, made so in its
    # rebuild, would take real memory, and each gradient copied into one would be counted again as a copy.
    from memlayout import _torch
    from memlayout.activations.ranks import analyze_ranks, ddp
    from memlayout.activations.ranks.parallel import ShardingOptions

    seen: list[object] = []
    recorded = ddp.BucketRecorder.tensors

    def tensors(self: ddp.BucketRecorder) -> list[object]:
        found = recorded(self)
        seen.extend(found)
        return found

    monkeypatch.setattr(ddp.BucketRecorder, "tensors", tensors)
    options = ShardingOptions(world_size=2, fsdp=False, ddp=DdpOptions(bucket_cap_mb=1))
    report = analyze_ranks(LLAMA, list(SHORT_TOKEN_SPECS), sharding=options)
    assert report.ddp is not None and len(seen) == len(report.ddp.buckets) == 4
    assert all(isinstance(tensor, _torch.FakeTensor) for tensor in seen)
