"""The request a Python call makes: `analyze`, `analyze_ranks`, `fit` and `weights_report` take the settings by name.

Each takes the target, its inputs and keyword inputs, and any setting of `StepRequest`
by its name (`dtype="bf16"`, `world_size=8`). The keywords these functions took
before the request existed still work, each read as the settings it stands for:
`mode` ("real": `real`), `lora` given as `LoraOptions`, `sharding` as
`ShardingOptions`, `generation` as `Generation`, `fit`'s `axis` and `seq_dim`, and
`weights_report`'s `remote`. Those types live in the layers above; they are read here
by their fields alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memlayout.activations.request.step_request import SETTINGS, StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.errors import SettingError


def call_request(target: Any, inputs: Any, kwargs: Mapping[str, Any] | None, pipeline: Pipeline,
                 settings: Mapping[str, Any]) -> StepRequest:
    """The request of one call: `inputs` a `pkg.mod:make_inputs` spec or a sequence of inputs, `settings` the
    call's keywords.

    Raises:
        SettingError: a keyword that is no setting, or settings that do not go together.
    """
    values = _older_keywords(dict(settings))
    unknown = [name for name in values if name not in SETTINGS]
    if unknown:
        raise SettingError(f"no setting {unknown[0]!r}", f"the settings are {', '.join(SETTINGS)}")
    if isinstance(inputs, str):
        values["inputs"] = inputs
    elif inputs is not None:
        values["input"] = tuple(inputs)
    return StepRequest(target=target, kwargs=kwargs, pipeline=pipeline, **values)


def _older_keywords(values: dict[str, Any]) -> dict[str, Any]:
    mode = values.pop("mode", None)
    if mode == "real":
        values["real"] = True
    elif mode == "meta":
        values["device"] = "meta"
    elif mode not in (None, "fake"):
        raise SettingError(f"unknown `mode` {mode!r}", "use fake, meta or real")
    lora = values.get("lora")
    if lora is not None and not isinstance(lora, int):  # LoraOptions
        values.update(lora=lora.rank, lora_targets=lora.targets, lora_dropout=lora.dropout, dora=lora.dora)
    sharding = values.pop("sharding", None)
    if sharding is not None:  # ShardingOptions
        values.update(_sharding_settings(sharding), **{k: v for k, v in values.items() if k == "dtype" and v})
    generation = values.pop("generation", None)
    if generation is not None:  # Generation
        values.update(new_tokens=generation.new_tokens, cache=generation.cache)
    axis, seq_dim = values.pop("axis", None), values.pop("seq_dim", None)
    if axis is not None or seq_dim is not None:
        values["fit"] = f"{axis or 'seq'}:{seq_dim}" if seq_dim is not None else axis
    remote = values.pop("remote", None)
    if remote is not None:  # RemoteOptions
        values.update(timeout=remote.timeout_s, download=remote.download)
    return values


def _sharding_settings(sharding: Any) -> dict[str, Any]:
    ddp = sharding.ddp
    settings = {
        "world_size": sharding.world_size, "fsdp": sharding.fsdp, "fsdp_modules": sharding.fsdp_modules,
        "no_reshard_after_forward": not sharding.reshard_after_forward, "param_dtype": sharding.param_dtype,
        "reduce_dtype": sharding.reduce_dtype, "tp": sharding.tp, "ddp": ddp is not None,
        "bucket_cap_mb": None if ddp is None else ddp.bucket_cap_mb,
        "gradient_as_bucket_view": False if ddp is None else ddp.gradient_as_bucket_view,
    }
    if sharding.serving is not None:
        settings["step"] = sharding.serving
    if sharding.model_dtype is not None:
        settings["dtype"] = sharding.model_dtype
    return settings
