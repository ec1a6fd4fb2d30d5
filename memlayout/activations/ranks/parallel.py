"""How a model is spread over ranks: which modules FSDP2 wraps, the tensor-parallel plan, and the code.

`resolve_sharding(model, options)` reads a model (on the meta device: nothing is
allocated) and decides everything the sharding needs: the blocks `fully_shard`
wraps (each block of the model's main `nn.ModuleList`, then the root, as FSDP2's
own examples and torchtitan do), and with `tp > 1` the column-wise and row-wise
`parallelize_module` plan for attention and MLP projections, matched by name as
torchtitan's Llama plan and transformers' `base_model_tp_plan` name them.

`Sharding.code()` is the Python that applies it: a `shard(model, device_type)`
function, plain torch, for the user's training script. The prediction runs that
same code on the model before tracing it, so the code a report prints is the
code its figures were measured with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memlayout.activations.model.module_patterns import main_blocks, modules_of
from memlayout.activations.ranks.checkpoint_code import checkpointing
from memlayout.activations.ranks.ddp import DdpOptions, ddp_code
from memlayout.activations.ranks.module_choice import reshard_after_forward
from memlayout.activations.ranks.module_lists import python_list
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import PRECISIONS
from memlayout.errors import UsageError

COLWISE = "colwise"
ROWWISE = "rowwise"

# Leaf names of the projections that split a block's work across tensor-parallel
# ranks. Column-wise layers shard their output features (each rank computes some
# heads, or some of the MLP's hidden units); the row-wise layer after them shards
# its input features and sums the partial results. These are the names of
# torchtitan's Llama plan (wq/wk/wv/wo, w1/w2/w3), transformers' base_model_tp_plan
# (q/k/v/o_proj, gate/up/down_proj), OPT, Phi and BART (fc1/fc2, out_proj), T5
# (q/k/v/o, wi/wo) and GPT-J (fc_in/fc_out).
COLUMN_NAMES = frozenset({
    "q_proj", "k_proj", "v_proj", "wq", "wk", "wv", "q", "k", "v", "query", "key", "value",
    "gate_proj", "up_proj", "w1", "w3", "fc1", "fc_in", "wi", "wi_0", "wi_1", "c_fc", "dense_h_to_4h",
})
# "dense" is row-wise only beside column-wise siblings (Phi's attention); alone (BERT's
# intermediate and output) it matches nothing, as a block needs both kinds.
ROW_NAMES = frozenset({
    "o_proj", "wo", "o", "out_proj", "down_proj", "w2", "fc2", "fc_out", "c_proj", "dense", "dense_4h_to_h",
})
# One projection computing q, k and v together: a column-wise split of it would give each
# rank a slice across q, k and v instead of whole heads of each, so it is left whole.
FUSED_NAMES = frozenset({"c_attn", "qkv_proj", "query_key_value", "Wqkv", "qkv", "in_proj"})


@dataclass(frozen=True)
class ShardingOptions:
    """How the ranks are asked to be sharded: a request's `world_size` and the settings of its ranks
    (`sharding_options`), checked there (request/rules.py)."""

    world_size: int
    fsdp: bool = True
    fsdp_modules: tuple[str, ...] = ()
    """Patterns naming the modules `fully_shard` wraps before the root (a dotted path where
    `*` matches one name, or a class name); empty for each block of the main nn.ModuleList."""
    reshard_after_forward: bool = True
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    tp: int = 1
    """Tensor-parallel degree; 1 for none."""
    model_dtype: str | None = None
    """`--dtype`: the dtype (float32, bfloat16, float16) the model's floating parameters and buffers are cast
    to before anything is sharded, as pure low-precision training does; None keeps the model's own."""
    ddp: DdpOptions | None = None
    """`--ddp`: DistributedDataParallel instead of FSDP2 (then `fsdp` is False): every rank holds the whole model."""
    serving: str | None = None
    """`--step inference` or `generate`: the ranks serve, one tensor-parallel group, no FSDP2 or DDP; None: training."""
    reshard_entries: tuple[str, ...] = ()
    """`--reshard-after-forward`: presets and PATTERN=BOOL entries over `reshard_after_forward` (module_choice.py)."""
    ac_modules: tuple[str, ...] = ()
    """Modules to checkpoint (patterns); empty with `selective_ac`: the main blocks."""
    selective_ac: str | None = None
    """The op-level policy of the checkpointed modules (plans/op_policies.py); None: every op recomputed."""

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.tp


def sharding_options(request: StepRequest) -> ShardingOptions:
    """The sharding a request's settings ask for: FSDP2 (and tensor parallel), DDP, or serving ranks."""
    assert request.world_size is not None
    return ShardingOptions(
        world_size=request.world_size, fsdp=request.fsdp, fsdp_modules=request.fsdp_modules,
        reshard_after_forward=not request.no_reshard_after_forward, param_dtype=_torch_name(request.param_dtype),
        reduce_dtype=_torch_name(request.reduce_dtype), tp=request.tp, model_dtype=_torch_name(request.dtype),
        ddp=DdpOptions(request.bucket_cap_mb, request.gradient_as_bucket_view) if request.ddp else None,
        serving=request.step if request.serving else None, reshard_entries=request.reshard_after_forward,
        ac_modules=request.ac_modules, selective_ac=request.selective_ac,
    )


def _torch_name(dtype: str | None) -> str | None:
    return None if dtype is None else PRECISIONS[dtype]


@dataclass(frozen=True)
class TensorParallelStyle:
    """One module of the tensor-parallel plan."""

    module: str
    style: str
    """colwise or rowwise."""


@dataclass(frozen=True)
class Sharding:
    """Everything that decides how one model is laid out over the ranks, resolved for that model."""

    world_size: int
    tp: int
    wrapped: tuple[str, ...]
    """Modules `fully_shard` wraps, in the order it is called; "" (the root) is last."""
    reshard_after_forward: tuple[bool, ...]
    """One per wrapped module (FSDP2 never reshards the root after forward, whatever it is told)."""
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    model_dtype: str | None = None
    """The dtype the model is cast to before sharding (`--dtype`); None keeps the model's own."""
    offload: bool = False
    """`CPUOffloadPolicy` on every wrapped module: parameters, gradients and optimizer state live on the CPU."""
    tp_plan: tuple[TensorParallelStyle, ...] = ()
    checkpoint: tuple[str, ...] = ()
    """Modules whose forward runs under `torch.utils.checkpoint` (use_reentrant=False)."""
    sequential: tuple[tuple[str, int], ...] = ()
    """nn.Sequential modules run through `checkpoint_sequential` with this many segments."""
    selective: tuple[tuple[str, str], ...] = ()
    """(module, policy): op-level checkpointing (`selective_ac`, plans/op_policies.py) of each module."""
    hf_cache: bool = False
    """The model is a Hugging Face model with `config.use_cache`, which checkpointing turns off."""
    ddp: DdpOptions | None = None
    """DistributedDataParallel's options where it replicates the model instead (`wrapped` is then empty)."""
    serving: bool = False
    """Tensor parallel alone, for a serving step: no `fully_shard` (`wrapped` is then empty)."""
    blocks: tuple[str, ...] = ()
    """Serving: the blocks whose projections the code shards in one loop (training groups by `wrapped`)."""
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.tp

    def with_changes(self, **changes: Any) -> Sharding:
        return replace(self, **changes)

    def resharded(self) -> dict[str, bool]:
        return dict(zip(self.wrapped, self.reshard_after_forward, strict=True))

    def code(self) -> str:
        """Python that applies this sharding: `shard(model, device_type="cuda")`, called on every rank; with DDP,
        `wrap(model)`, which returns the module to train."""
        return _code(self)


def fsdp_targets(model: Any, patterns: Sequence[str]) -> tuple[str, ...]:
    """The modules to `fully_shard` before the root, in definition order.

    Raises:
        UsageError: a pattern matches no module.
    """
    if not patterns:
        return main_blocks(model)
    found = modules_of(model, patterns, "fsdp_modules")
    order = {path: index for index, (path, _) in enumerate(model.named_modules())}
    # fully_shard wraps inner modules first: a module inside another is wrapped before it.
    return tuple(sorted(found, key=lambda p: (-p.count("."), order[p])))


def tensor_parallel_plan(model: Any, tp: int) -> tuple[tuple[TensorParallelStyle, ...], tuple[str, ...]]:
    """The column-wise/row-wise plan for every block whose projections match by name.

    A parent module qualifies when its nn.Linear children include at least one
    column-wise name and one row-wise name: the row-wise layer sums what the
    column-wise ones split, so the block's output is whole again.

    Returns:
        The plan, and the blocks left whole, each with the reason.

    Raises:
        UsageError: no block matches, or `tp` does not divide a dimension the plan shards.
    """
    import torch

    plan: list[TensorParallelStyle] = []
    near_misses: list[str] = []
    for path, module in model.named_modules():
        children = list(module.named_children())
        names = {name for name, _ in children}
        if names & FUSED_NAMES and names & ROW_NAMES:
            near_misses.append(f"{path or 'the model'}: {', '.join(sorted(names & FUSED_NAMES))} computes q, k and v "
                               "in one projection, which a column-wise split would mix")
        if not (names & COLUMN_NAMES and names & ROW_NAMES):
            if names & COLUMN_NAMES and not names & FUSED_NAMES:
                near_misses.append(f"{path or 'the model'}: {', '.join(sorted(names & COLUMN_NAMES))} ha"
                                   f"{'s' if len(names & COLUMN_NAMES) == 1 else 've'} no row-wise projection beside "
                                   "it to sum the split")
            continue
        styles = [(name, child, COLWISE if name in COLUMN_NAMES else ROWWISE)
                  for name, child in children if name in COLUMN_NAMES | ROW_NAMES]
        not_linear = [f"{name} is a {type(child).__name__}" for name, child, _ in styles
                      if not isinstance(child, torch.nn.Linear)]
        if not_linear:
            near_misses.append(f"{path or 'the model'}: {', '.join(not_linear)}, and ColwiseParallel and "
                               "RowwiseParallel shard nn.Linear only")
            continue
        for name, child, style in styles:
            dimension = child.out_features if style == COLWISE else child.in_features
            full = f"{path}.{name}" if path else name
            if dimension % tp:
                kind = "output" if style == COLWISE else "input"
                raise UsageError(
                    f"`tp` {tp} does not divide {full}'s {dimension} {kind} features, which the {style} plan shards",
                    f"pick a `tp` that divides {dimension}",
                )
            plan.append(TensorParallelStyle(full, style))
    if not plan:
        why = f" ({'; '.join(near_misses[:2])})" if near_misses else ""
        raise UsageError(
            f"`tp` found no attention or MLP projections to shard in {type(model).__name__}{why}",
            "tensor parallel needs nn.Linear projections named like q_proj/k_proj/v_proj/o_proj, "
            "gate_proj/up_proj/down_proj, wq/wk/wv/wo, w1/w2/w3 or fc1/fc2; leave `tp` out for FSDP alone",
        )
    _check_heads(model, tp)
    return tuple(plan), tuple(f"tensor parallel leaves {miss}: that block is computed whole on every rank"
                              for miss in near_misses)


def _check_heads(model: Any, tp: int) -> None:
    """Whole attention heads per rank: a column-wise split that cuts a head in two computes nonsense."""
    config = getattr(model, "config", None)
    for name in ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads"):
        heads = getattr(config, name, None)
        if isinstance(heads, int) and heads % tp:
            raise UsageError(
                f"`tp` {tp} does not divide the model's {heads} attention heads (config.{name})",
                f"pick a `tp` that divides {heads}",
            )


def resolve_sharding(model: Any, options: ShardingOptions) -> Sharding:
    """The sharding of `options` for this model (built on the meta device; nothing is run).

    Raises:
        UsageError: the options do not fit the model (the request checked them alone: request/rules.py).
    """
    config = getattr(model, "config", None)
    hf_cache = config is not None and hasattr(config, "use_cache")
    if options.serving is not None:
        serving_plan, left_whole = tensor_parallel_plan(model, options.tp)
        return Sharding(world_size=options.world_size, tp=options.tp, wrapped=(), reshard_after_forward=(),
                        model_dtype=options.model_dtype, tp_plan=serving_plan, hf_cache=hf_cache, serving=True,
                        blocks=main_blocks(model), notes=tuple(left_whole[:3]))
    checkpointed = _checkpointed(model, options)
    if options.ddp is not None:
        return Sharding(world_size=options.world_size, tp=1, wrapped=(), reshard_after_forward=(),
                        model_dtype=options.model_dtype, hf_cache=hf_cache, ddp=options.ddp, **checkpointed)
    blocks = fsdp_targets(model, options.fsdp_modules)
    notes: list[str] = []
    if not blocks:
        notes.append(
            f"{type(model).__name__} has no nn.ModuleList of blocks, so fully_shard wraps only the root: every "
            "parameter is gathered at once in forward (--fsdp-modules names modules to wrap one by one)"
        )
    tp_plan: tuple[TensorParallelStyle, ...] = ()
    if options.tp > 1:
        tp_plan, left_whole = tensor_parallel_plan(model, options.tp)
        notes.extend(left_whole[:3])
    wrapped = (*blocks, "")
    return Sharding(
        world_size=options.world_size,
        tp=options.tp,
        wrapped=wrapped,
        reshard_after_forward=reshard_after_forward(model, wrapped, options.reshard_after_forward,
                                                    options.reshard_entries),
        param_dtype=options.param_dtype,
        reduce_dtype=options.reduce_dtype,
        model_dtype=options.model_dtype,
        tp_plan=tp_plan,
        hf_cache=hf_cache,
        notes=tuple(notes),
        **checkpointed,
    )


def _checkpointed(model: Any, options: ShardingOptions) -> dict[str, Any]:
    """The modules the user checkpoints (`ac_modules`), whole or by `selective_ac`'s op-level policy."""
    if not options.ac_modules and options.selective_ac is None:
        return {}
    paths = modules_of(model, options.ac_modules, "ac_modules") if options.ac_modules else main_blocks(model)
    if options.selective_ac is None:
        return {"checkpoint": paths}
    return {"selective": tuple((path, options.selective_ac) for path in paths)}


# ----------------------------------------------------------------------------------------------
# The code


def _tensor_parallel_lines(sharding: Sharding) -> list[str]:
    """parallelize_module calls: one per group of blocks that share a plan (torchtitan's per-block loop), then the
    projections outside every block, by their full paths (no `*` patterns, which would also try paths that are
    not there)."""
    blocks = [path for path in (sharding.blocks if sharding.serving else sharding.wrapped) if path]
    inside: dict[str, list[tuple[str, str]]] = {}
    outside: list[tuple[str, str]] = []
    for entry in sharding.tp_plan:
        block = max((b for b in blocks if entry.module.startswith(b + ".")), key=len, default=None)
        if block is None:
            outside.append((entry.module, entry.style))
        else:
            inside.setdefault(block, []).append((entry.module[len(block) + 1:], entry.style))
    by_plan: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for block, relative in inside.items():
        by_plan.setdefault(tuple(relative), []).append(block)

    def plan_lines(entries: Sequence[tuple[str, str]], indent: str) -> list[str]:
        return [f"{indent}{path!r}: {'ColwiseParallel' if style == COLWISE else 'RowwiseParallel'}(),"
                for path, style in entries]

    lines: list[str] = []
    for plan, members in by_plan.items():
        lines.append(f"    for path in {python_list(members, '    ')}:")
        lines.append('        parallelize_module(model.get_submodule(path), mesh["tp"], {')
        lines += plan_lines(plan, "            ")
        lines.append("        })")
    if outside:
        lines.append('    parallelize_module(model, mesh["tp"], {')
        lines += plan_lines(outside, "        ")
        lines.append("    })")
    return lines


def _serving_code(sharding: Sharding) -> str:
    """Tensor parallel alone, as a server lays a model out over one group of ranks."""
    lines = ["import torch", "from torch.distributed.device_mesh import init_device_mesh",
             "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module",
             "", "", 'def shard(model, device_type="cuda"):',
             f'    """Lay `model` out over {sharding.tp} ranks (tensor parallel, to serve); call it on every rank."""']
    if sharding.model_dtype:
        lines.append(f"    model.to(torch.{sharding.model_dtype})  # the parameters' own dtype, cast before sharding")
    lines.append(f'    mesh = init_device_mesh(device_type, ({sharding.tp},), mesh_dim_names=("tp",))')
    lines += _tensor_parallel_lines(sharding)
    lines.append("    return model")
    return "\n".join(lines) + "\n"


def _code(sharding: Sharding) -> str:
    checkpoint_imports, checkpoint_lines = checkpointing(sharding)
    if sharding.serving:
        return _serving_code(sharding)
    if sharding.ddp is not None:
        return ddp_code(sharding.world_size, sharding.ddp, sharding.model_dtype, checkpoint_imports, checkpoint_lines)
    dp, tp = sharding.data_parallel, sharding.tp
    lines = ["import functools", "", "import torch", "from torch.distributed.device_mesh import init_device_mesh"]
    fsdp_names = ["fully_shard"]
    if sharding.param_dtype or sharding.reduce_dtype:
        fsdp_names.insert(0, "MixedPrecisionPolicy")
    if sharding.offload:
        fsdp_names.insert(0, "CPUOffloadPolicy")
    lines.append(f"from torch.distributed.fsdp import {', '.join(fsdp_names)}")
    if sharding.tp_plan:
        lines.append("from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module")
    lines += checkpoint_imports
    what = f"FSDP2 over {dp} ranks" + (f" x tensor parallel over {tp}" if tp > 1 else "")
    lines += ["", "", 'def shard(model, device_type="cuda"):',
              f'    """Lay `model` out over {sharding.world_size} ranks ({what}); call it on every rank."""']
    if sharding.model_dtype:
        # Before tensor parallel and fully_shard: each shard, and the optimizer state made from it, is in this dtype.
        lines.append(f"    model.to(torch.{sharding.model_dtype})  # the parameters' own dtype, cast before sharding")
    if tp > 1:
        lines.append(f'    mesh = init_device_mesh(device_type, ({dp}, {tp}), mesh_dim_names=("dp", "tp"))')
        lines += _tensor_parallel_lines(sharding)
        fsdp_mesh = 'mesh["dp"]'
    else:
        lines.append(f"    mesh = init_device_mesh(device_type, ({dp},))")
        fsdp_mesh = "mesh"
    lines += checkpoint_lines
    policy = [f"mesh={fsdp_mesh}"]
    if sharding.param_dtype or sharding.reduce_dtype:
        args = ", ".join(f"{name}=torch.{value}" for name, value in
                         (("param_dtype", sharding.param_dtype), ("reduce_dtype", sharding.reduce_dtype)) if value)
        policy.append(f"mp_policy=MixedPrecisionPolicy({args})")
    if sharding.offload:
        policy.append("offload_policy=CPUOffloadPolicy()")
    lines.append(f"    policy = dict({', '.join(policy)})")
    resharded = sharding.resharded()
    root_reshard = resharded.pop("", True)
    for value in (True, False):
        paths = [p for p, r in resharded.items() if r is value]
        if paths:
            lines.append(f"    for path in {python_list(paths, '    ')}:")
            lines.append(f"        fully_shard(model.get_submodule(path), reshard_after_forward={value}, **policy)")
    lines.append(f"    fully_shard(model, reshard_after_forward={root_reshard}, **policy)")
    lines.append("    return model")
    return "\n".join(lines) + "\n"


def run_code(code: str, model: Any, device_type: str) -> Any:
    """Apply sharding code (`Sharding.code()`) to a model, as the user's script would."""
    namespace: dict[str, Any] = {}
    exec(compile(code, "<memlayout sharding code>", "exec"), namespace)
    return namespace["shard"](model, device_type)
