"""What `memlayout activations TARGET` builds the model from.

- `pkg.module:build`: your factory, called with no arguments;
- a Hugging Face model directory or its `config.json`: built from the config by
  transformers, no weights read;
- a pickled nn.Module (torch.save of the whole module), only with `--trust`:
  unpickling it runs code from the file.

The caller chooses the tensors the model is built on by the context it calls
from: a FakeTensorMode (no memory), `torch.device("meta")`, or nothing (real).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from memlayout.errors import SourceNotFoundError, UnsafeContentError, UsageError

CONFIG = "config.json"


@dataclass(frozen=True)
class TargetKind:
    kind: str
    """import-spec, hf-config, pickled-module or module."""
    path: str | None


def classify(target: str) -> TargetKind:
    """Which kind of target a command-line TARGET is, without building anything."""
    from memlayout.load.import_spec import looks_like_spec

    if os.path.isdir(target):
        if not os.path.isfile(os.path.join(target, CONFIG)):
            raise SourceNotFoundError(
                f"{target} is a directory without {CONFIG}",
                "give a Hugging Face model directory, its config.json, or pkg.module:build",
            )
        return TargetKind("hf-config", os.path.join(target, CONFIG))
    if os.path.isfile(target):
        if target.endswith(".json"):
            return TargetKind("hf-config", target)
        return TargetKind("pickled-module", target)
    if looks_like_spec(target):
        return TargetKind("import-spec", target)
    raise SourceNotFoundError(f"{target} does not exist and is not a pkg.module:callable spec")


def build_model(target: str, *, trust: bool) -> tuple[Any, TargetKind]:
    """Build the model TARGET names, in the current tensor context.

    Raises:
        SourceNotFoundError, UsageError, UnsafeContentError: one line for the CLI.
    """
    import torch

    kind = classify(target)
    if kind.kind == "import-spec":
        from memlayout.load.import_spec import resolve_spec

        model = resolve_spec(target)
    elif kind.kind == "hf-config":
        model = _build_hf(kind.path or target, trust=trust)
    else:
        model = _load_pickled_module(target, trust=trust)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"{target} gave a {type(model).__name__}, not an nn.Module",
            "point TARGET at a factory that returns the model, a config.json, or a pickled module",
        )
    return model, kind


def _build_hf(config_path: str, *, trust: bool) -> Any:
    try:
        import transformers
    except ImportError:
        raise UsageError(
            f"{config_path} is a Hugging Face config, and transformers is not installed", "pip install transformers"
        ) from None
    try:
        with open(config_path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{config_path} is not readable JSON ({exc})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise UsageError(f"{config_path} has no model_type", "give the config.json of a transformers model")
    if raw.get("auto_map") and not trust:
        raise UnsafeContentError(
            f"{config_path} needs the model's own code (auto_map), which runs code from the model's directory"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(config_path, trust_remote_code=trust)
    except Exception as exc:
        raise UsageError(f"transformers cannot read {config_path}: {exc}") from None
    candidates = [getattr(transformers, name, None) for name in (getattr(config, "architectures", None) or [])]
    model_class = next((c for c in candidates if c is not None), None)
    try:
        if model_class is not None:
            return model_class._from_config(config)
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
            try:
                return auto.from_config(config, trust_remote_code=trust)  # type: ignore[no-untyped-call]
            except ValueError:
                continue
    except Exception as exc:
        raise UsageError(f"transformers cannot build a model from {config_path}: {type(exc).__name__}: {exc}") from None
    raise UsageError(f"transformers has no model class for {config_path}")


def _load_pickled_module(path: str, *, trust: bool) -> Any:
    import torch

    if not trust:
        raise UnsafeContentError(
            f"{path} would have to be unpickled to build the model, which runs code from the file",
            "pass --trust only if you trust whoever wrote it, or give pkg.module:build",
        )
    try:
        # Under FakeTensorMode torch.load rebuilds every tensor as a fake one, ties kept: the
        # weights never take memory (a 384 MiB module file raised peak RSS by 73 MiB here).
        return torch.load(path, weights_only=False, map_location="cpu")
    except Exception as exc:
        raise UsageError(f"cannot unpickle a module from {path}: {type(exc).__name__}: {exc}") from None
