"""`--step generate`: `model.generate(prompt, max_new_tokens=N, do_sample=False)`, as serving code runs it.

Greedy decoding with transformers' own `generate`, in eval mode and under
`torch.inference_mode`: the prompt's forward (the prefill) fills the key/value
cache, then each new token is one more forward over that token alone. The cache
is transformers' default (`DynamicCache`, which grows by `torch.cat` at every
token, so each layer's keys and values are reallocated one token longer) or the
static one (`cache_implementation="static"`: every layer's keys and values
allocated at their final length at the first forward, and written in place).

Which token comes next follows values the weights decide, and so does when a
sequence ends: a greedy sequence ends at its end-of-sequence token, and generate
stops when every sequence of the batch has. The step runs the full N tokens, as
a real generate does when no sequence meets its end: it is given an end-of-sequence
id that no token can have (the width of the logits), so that the stop check, which
reads values, always reads "not finished". That is the most memory a generate of
N tokens can take; a batch whose every sequence ends early stops sooner, lower.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from memlayout.activations.request.step_request import StepRequest
from memlayout.errors import UsageError

CACHE_HELP = (
    "With --step generate, the key/value cache: dynamic (transformers' default DynamicCache, which grows by one "
    "token a step) or static (cache_implementation='static': allocated whole at the prompt's forward)."
)
NEW_TOKENS_HELP = (
    "With --step generate: how many tokens model.generate adds to the prompt (max_new_tokens; greedy, and run to "
    "the end, as when no sequence meets its end-of-sequence token)."
)
_CACHE_KEYS = ("cache", "past_key_values", "state", "mems", "past_buckets_states", "cache_params")
"""Where a model's output holds its cache: transformers 5 names it `cache`, earlier versions `past_key_values`,
and a few models their own (transformers' ALL_CACHE_NAMES)."""
_CACHE_DEPTH = 4
"""How deep `cache_tensors` looks into a cache object: a cache, its sub-caches, their layers, their tensors."""


class Generation(NamedTuple):
    """What `--step generate` runs."""

    new_tokens: int
    """`max_new_tokens`: every sequence gets this many, the stop check always reading "not finished"."""
    cache: str = "dynamic"
    """dynamic (transformers' DynamicCache) or static (`cache_implementation="static"`)."""

    def note(self) -> str:
        """What the step assumed, as the report says it."""
        return (f"generate ran all {self.new_tokens} new tokens of every sequence, as when none meets its "
                "end-of-sequence token (given one that no token can be): the most memory such a generate "
                "takes; a batch whose every sequence ends sooner stops sooner")


def generation_of(request: StepRequest) -> Generation | None:
    """What a request's `step` generate runs (its `new_tokens` and `cache`); None for a step that generates nothing.
    The request checked them (request/rules.py)."""
    if request.step != "generate" or request.new_tokens is None:
        return None
    return Generation(request.new_tokens, request.cache or "dynamic")


def check_can_generate(model: Any) -> None:
    """Raises UsageError unless `model.generate` is transformers' and the model can generate."""
    can_generate = getattr(model, "can_generate", None)
    if not callable(getattr(model, "generate", None)) or not callable(can_generate) or not can_generate():
        raise UsageError(
            f"`step` generate runs transformers' model.generate, and {type(model).__name__} cannot generate",
            "give a model with a language-modelling head (a ...ForCausalLM or ...ForConditionalGeneration "
            "class), or use `step` inference for one forward",
        )


def logits_width(model: Any) -> int | None:
    """How many logits the model gives each token: its output embeddings' rows, else its config's vocab_size."""
    get_output = getattr(model, "get_output_embeddings", None)
    head = get_output() if callable(get_output) else None
    weight = getattr(head, "weight", None)
    if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
        return int(weight.shape[0])
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    return int(vocab) if isinstance(vocab, int) else None


def generate_kwargs(model: Any, generation: Generation) -> dict[str, Any]:
    """`model.generate`'s keyword arguments beside the inputs: greedy, N new tokens, the cache, and (where the
    model has an end-of-sequence token) one that no token can be, so that every sequence runs to N."""
    kwargs: dict[str, Any] = {"max_new_tokens": generation.new_tokens, "do_sample": False}
    if generation.cache == "static":
        kwargs["cache_implementation"] = "static"
    config = getattr(model, "generation_config", None)
    width = logits_width(model)
    if config is not None and getattr(config, "eos_token_id", None) is not None and width is not None:
        kwargs["eos_token_id"] = width
    return kwargs


def run_generate(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], generation: Generation) -> Any:
    """`model.generate` on the inputs (the prompt's token ids first), under `torch.inference_mode`; returns the
    generated ids, which the caller keeps as a server keeps its answer."""
    import torch

    with torch.inference_mode():
        return model.generate(*args, **kwargs, **generate_kwargs(model, generation))


def cache_of(output: Any) -> Any:
    """The key/value cache a forward returned (a transformers `Cache`, or tuples of tensors); None without one."""
    getter = output.get if isinstance(output, Mapping) else None
    for key in _CACHE_KEYS:
        value = getter(key) if getter is not None else getattr(output, key, None)
        if value is not None:
            return value
    return None


def cache_tensors(cache: Any) -> Iterator[Any]:
    """Every tensor a cache holds: a `Cache`'s layers' keys and values (and a static cache's lengths, a linear
    attention's states), the self- and cross-attention caches of an encoder-decoder, or nested tuples."""
    import torch

    seen: set[int] = set()

    def walk(node: Any, depth: int) -> Iterator[Any]:
        if isinstance(node, torch.Tensor):
            yield node
            return
        if depth > _CACHE_DEPTH or id(node) in seen or node is None or isinstance(node, (str, bytes, int, float)):
            return
        seen.add(id(node))
        if isinstance(node, Mapping):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        elif hasattr(node, "__dict__"):
            children = vars(node).values()
        else:
            return
        for child in children:
            yield from walk(child, depth + 1)

    return walk(cache, 0)
