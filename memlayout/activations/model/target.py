"""What `memlayout activations TARGET` builds the model from.

- `pkg.module:build`: your factory, called with no arguments;
- a Hugging Face model directory or its `config.json`: built from the config by
  transformers, no weights read; the directory may be remote (an https:// URL of
  the config.json or its folder, `hf://ORG/NAME[@REVISION]`, or a bare Hub id when
  no local path has that name): only config.json is fetched, and a config that
  needs the model's own code is refused whatever `--trust` says;
- a pickled nn.Module (torch.save of the whole module), only with `--trust`:
  unpickling it runs code from the file.

`model_source` checks the target and returns how to build it; build.py calls
that in the tensor context it chooses: a FakeTensorMode (no memory),
`torch.device("meta")`, or nothing (real).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.activations.model.hf_class import ChosenClass, choose_class
from memlayout.activations.request.step_request import ModelTarget
from memlayout.errors import (
    CorruptCheckpointError,
    MemlayoutError,
    SettingError,
    SourceNotFoundError,
    UnrecognizedFormatError,
    UnsafeContentError,
    UsageError,
)
from memlayout.load import detect_format, load_path
from memlayout.load.main_module import classes_from_main, pickle_module_resolving_main
from memlayout.load.remote_location import RemoteOptions, remote_location

if TYPE_CHECKING:
    from memlayout.load.records import PickleGlobal

CONFIG = "config.json"

GIVE_INSTEAD = "give pkg.module:build, or the model's config.json or Hugging Face directory"
"""What a TARGET that cannot build a model is replaced by, in every refusal's hint."""

MODULE_PICKLES = {
    "torch-zip": "torch.save zip file", "torch-legacy": "legacy torch.save file",
    "torch-legacy-tar": "tar-format torch.save file",
}
"""The formats torch.load returns a whole pickled nn.Module from (torch.save of the module), as messages name them."""

_NOT_A_MODEL = {
    "safetensors": "a safetensors file: weights only, without the model's code",
    "dcp": "a torch.distributed.checkpoint directory: weights only, without the model's code",
    "hf-dir": f"a Hugging Face directory without {CONFIG}: weights only, and no config to build the model from",
    "torchscript": "a TorchScript archive: activations traces a Python nn.Module's step on fake tensors, "
                   "and TorchScript runs its own compiled code, which cannot be traced that way",
    "torch-export": "a torch.export program (.pt2): activations traces a Python nn.Module's step, and does not "
                    "run an exported graph",
    "pickle": "a bare pickle, not a torch.save file: torch.load cannot read a module from it",
}
"""Why each format memlayout detects, other than MODULE_PICKLES, builds no model to trace."""


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
            _refuse_weights_directory(target)
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

    if remote_location(target) is not None:
        return TargetKind("hf-config", target)
    raise SourceNotFoundError(f"{target} does not exist and is not a pkg.module:callable spec")


@dataclass(frozen=True)
class ModelSource:
    """How to build the model TARGET names, checked and ready: nothing is built yet."""

    kind: TargetKind
    action: str
    """What building does, for messages: "calling pkg:build", "building GPT2LMHeadModel from config.json"."""
    build: Callable[[], Any]
    """Builds the model in the current tensor context."""
    values_free: bool
    """Whether building may be retried with tensors that are not fake (the user's factory or a config);
    False for an unpickled module, whose tensors come from the file."""
    prebuilt: bool = False
    """The spec names a model built when its module was imported: it is copied, never changed."""
    class_chosen_by: str = ""
    """Why the model is of the class it is, as reports say it (see hf_class.py for a config)."""


def model_source(model: ModelTarget) -> ModelSource:
    """Check TARGET and say how its model is built: the spec is imported, the config read, trust checked.

    `model.main_module` is the module that defines the classes a pickled module's file
    names as `__main__.X` (it was saved from a script); only with `trust`.
    `model.model_class` is the transformers class a config builds, instead of the one
    hf_class.py's rule chooses; only for a config.

    Raises:
        SourceNotFoundError, UsageError, UnsafeContentError: one line for the CLI.
    """
    import torch

    target, trust, main_module = model.target, model.trust, model.main_module
    kind = classify(target)
    if main_module is not None and kind.kind != "pickled-module":
        raise SettingError(f"`main_module` applies to a pickled module file, and {target} is none",
                           "drop `main_module`")
    if model.model_class is not None and kind.kind != "hf-config":
        raise SettingError(f"`model_class` chooses the class a Hugging Face config builds, and {target} is none",
                           "drop `model_class`; the factory or the file decides the class")
    if kind.kind == "import-spec":
        from memlayout.load.import_spec import spec_object

        named = spec_object(target)
        if isinstance(named, torch.nn.Module) or not callable(named):
            return ModelSource(kind, f"importing {target}", lambda: named, values_free=False, prebuilt=True,
                               class_chosen_by=f"named by {target}")
        _check_needs_no_arguments(target, named)
        return ModelSource(kind, f"calling {target}", named, values_free=True,
                           class_chosen_by=f"returned by {target}")
    if kind.kind == "hf-config":
        config_path = kind.path or target
        if not os.path.exists(config_path):
            chosen, config = _remote_hf_class(config_path, model)
        else:
            chosen, config = _hf_class(config_path, model)
        name = getattr(chosen.cls, "__name__", "the model")
        return ModelSource(kind, f"building {name} from {config_path}", lambda: _build_hf(chosen.cls, config, trust),
                           values_free=True, class_chosen_by=chosen.chosen_by)

    from_main = classes_from_main(_check_pickled_module(target))
    _refuse_untrusted_pickle(target, trust, from_main)
    if from_main and main_module is None:
        raise SettingError(
            f"{target} was saved from a script: its pickle looks up {_listed(from_main)} in __main__, "
            "and memlayout is not that script",
            f"pass `main_module=MODULE`, the module on PYTHONPATH that defines {_listed(from_main)}",
        )
    return ModelSource(kind, f"unpickling {target}", lambda: _load_pickled_module(target, main_module),
                       values_free=False, class_chosen_by=f"pickled in {target}")


def checked_model(model: Any, target: str) -> Any:
    """The built object, if it is an nn.Module.

    Raises:
        UsageError: it is something else.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"{target} gave a {type(model).__name__}, not an nn.Module",
            "point TARGET at a factory that returns the model, a config.json, or a pickled module",
        )
    return model


def _check_needs_no_arguments(spec: str, factory: Callable[..., Any]) -> None:
    import inspect

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: calling it says
        return
    required = [
        name for name, parameter in signature.parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               inspect.Parameter.KEYWORD_ONLY)
    ]
    if required:
        raise UsageError(
            f"calling {spec} needs arguments: {', '.join(required)}",
            "point the spec at a factory that builds the model with no arguments",
        )


def _hf_class(config_path: str, model: ModelTarget, shown_as: str | None = None) -> tuple[ChosenClass, Any]:
    """The transformers class the config builds (hf_class.py's rule, or `model.model_class`) and the config.

    `shown_as` names the config in messages, where `config_path` is a local copy of a remote one.
    """
    trust = model.trust
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
    return choose_class(config, model.model_class, os.path.basename(shown_as or config_path)), config


def _remote_hf_class(target: str, model: ModelTarget) -> tuple[ChosenClass, Any]:
    """`_hf_class` of a remote config.json, fetched alone into a temporary folder."""
    import tempfile

    from memlayout.load.remote import fetch_remote_config

    location = remote_location(target)
    assert location is not None  # classify said so
    if model.trust:
        # `trust` would let transformers run the repository's own code (auto_map): never for a URL.
        raise SettingError(
            f"`trust` does not reach remote files: {target} is read as configuration only",
            "download the repository, read its code, and pass `trust=True` on the local copy",
        )
    url, text = fetch_remote_config(location, RemoteOptions())
    with tempfile.TemporaryDirectory(prefix="memlayout-config-") as folder:
        path = os.path.join(folder, CONFIG)
        with open(path, "wb") as handle:
            handle.write(text)
        try:
            return _hf_class(path, model._replace(trust=False), shown_as=url)
        except (UsageError, UnsafeContentError) as exc:
            raise type(exc)(exc.message.replace(path, url), exc.hint) from None


def _build_hf(model_class: Any, config: Any, trust: bool) -> Any:
    import transformers

    if model_class is not None:
        return model_class._from_config(config)
    # No class in transformers: the config's auto_map names its own code, which the auto classes run.
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        try:
            return auto.from_config(config, trust_remote_code=trust)  # type: ignore[no-untyped-call]
        except ValueError:
            continue
    raise UsageError(f"transformers has no model class for {getattr(config, 'model_type', 'this config')}")


def _refuse_weights_directory(path: str) -> None:
    # A directory of weights (DCP, safetensors shards) is named as what it is,
    # rather than only as a directory that lacks a config.
    try:
        found = detect_format(path)
    except MemlayoutError:
        return
    if found in _NOT_A_MODEL:
        raise UsageError(f"{path} is {_NOT_A_MODEL[found]}", GIVE_INSTEAD)


def _check_pickled_module(path: str) -> list[PickleGlobal]:
    """Refuse, before any unpickling and with or without --trust, a file that holds no pickled module.

    The format is detected as `memlayout inspect` detects it, and a torch.save file is
    read by the restricted unpickler, which executes nothing: a state dict is told
    what it is, not to pass --trust.

    Returns:
        The globals its pickle names.

    Raises:
        UsageError, UnrecognizedFormatError, CorruptCheckpointError: one line naming the format.
    """
    try:
        found = detect_format(path)
    except UnrecognizedFormatError as exc:
        raise UnrecognizedFormatError(f"{exc.message}, so it holds no model to build", GIVE_INSTEAD) from None
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{exc.message}, so it holds no model to build", GIVE_INSTEAD) from None
    if found not in MODULE_PICKLES:
        raise UsageError(f"{path} is {_NOT_A_MODEL.get(found, found)}", GIVE_INSTEAD)
    with load_path(path) as source:
        modules = [module.path for module in source.modules]
        pickle_globals = source.pickle_globals
    if "" in modules:
        return pickle_globals
    held = f"a checkpoint whose nn.Module is under {modules[0].split('.')[0]!r}" if modules else \
        "a state dict or checkpoint: weights without the model's code"
    raise UsageError(
        f"{path} is a {MODULE_PICKLES[found]} whose top object is no nn.Module ({held})",
        f"{GIVE_INSTEAD}; `trust` would not help, since torch.load returns no model from it",
    )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _refuse_untrusted_pickle(path: str, trust: bool, from_main: list[str]) -> None:
    if not trust:
        # Saved from a script, the file needs both options: say so at once.
        main = f" `main_module=MODULE` (the module on PYTHONPATH that defines {_listed(from_main)})" \
            if from_main else ""
        raise UnsafeContentError(
            f"{path} would have to be unpickled to build the model, which runs code from the file",
            f"pass `trust=True`{main} only if you trust whoever wrote it, or give pkg.module:build",
        )


def _load_pickled_module(path: str, main_module: str | None) -> Any:
    import pickle

    import torch


    pickle_module = pickle_module_resolving_main(main_module) if main_module is not None else pickle
    try:
        # Under FakeTensorMode torch.load rebuilds every tensor as a fake one, ties kept: the
        # weights never take memory (a 384 MiB module file raised peak RSS by 73 MiB here).
        return torch.load(path, weights_only=False, map_location="cpu", pickle_module=pickle_module)
    except (AttributeError, ImportError) as exc:
        raise UsageError(
            f"cannot unpickle a module from {path}: a class it names cannot be imported here ({exc})",
            "put the model's code on PYTHONPATH, or install its package, so that its classes import",
        ) from None
    except Exception as exc:
        raise UsageError(f"cannot unpickle a module from {path}: {type(exc).__name__}: {exc}") from None
