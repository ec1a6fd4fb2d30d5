"""Models written as people write them, which fake tensors alone cannot build or run.

Each is small and seeded, so a real CPU step measured by MemTracker is the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DropPath(nn.Module):
    """Stochastic depth, as vision transformers use it: a per-sample keep mask."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rate == 0.0 or not self.training:
            return x
        keep = torch.rand(x.shape[0], 1, 1, device=x.device) >= self.rate
        return x * keep / (1.0 - self.rate)


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, drop_path: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, dim)
        x = x + self.drop_path(self.proj(attention))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    """A vision transformer initialised as timm does: drop-path rates read from `torch.linspace(...)` with
    `.item()`, and truncated-normal weights (torch's `trunc_normal_` reads values to reject samples)."""

    def __init__(self, image: int = 32, patch: int = 8, dim: int = 64, depth: int = 4, heads: int = 4,
                 classes: int = 10, drop_path_rate: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        rates = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads, rate) for rate in rates])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        bound = float(torch.tensor(dim, dtype=torch.float32).rsqrt())  # a bound computed by a tensor op
        nn.init.trunc_normal_(self.pos_embed, std=bound, a=-2 * bound, b=2 * bound)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class TiedLM(nn.Module):
    """A language model whose head is its embedding (one Parameter, two modules), with a value-reading init."""

    def __init__(self, vocab: int = 300, width: int = 48, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        scales = torch.linspace(1.0, 0.5, layers).tolist()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])
        for layer, scale in zip(self.layers, scales, strict=True):
            nn.init.trunc_normal_(layer.weight, std=0.02 * scale)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return self.head(x)


class SharedBuffer(nn.Module):
    """Two parameters that are views of one flat buffer, made in `__init__` (a flat-parameter layout)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        flat = torch.randn(2 * width * width) * float(torch.tensor(width).rsqrt())
        self.first = nn.Parameter(flat[: width * width].view(width, width))
        self.second = nn.Parameter(flat[width * width :].view(width, width))
        nn.init.trunc_normal_(self.first, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.first) @ self.second


class ReadsItsWeights(nn.Module):
    """An `__init__` that reads a value computed from a parameter: no tensor without data can build it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(16, 16)
        self.scale = 1.0 / self.linear.weight.abs().max().item()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


class GroupedExperts(nn.Module):
    """Mixture-of-experts feed-forward as transformers writes it for training: tokens sorted by expert, one
    `torch._grouped_mm` per projection over all experts. Its fake kernel refuses float32; the CPU kernel runs it."""

    def __init__(self, width: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(width, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, width, hidden) * width**-0.5)
        self.down = nn.Parameter(torch.randn(experts, hidden, width) * hidden**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, width = x.shape
        weights, chosen = torch.topk(self.router(x).softmax(-1), self.top_k)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        hidden = F.gelu(torch._grouped_mm(x[order // self.top_k], self.up, offs=offsets))
        out = torch._grouped_mm(hidden, self.down, offs=offsets) * weights.reshape(-1)[order, None]
        unsorted = torch.empty_like(out)
        unsorted[order] = out
        return unsorted.view(tokens, self.top_k, width).sum(1)


class MoELM(nn.Module):
    """A decoder of pre-norm mixture-of-experts layers; `experts` is the layer class that routes the tokens."""

    def __init__(self, experts: type[nn.Module], vocab: int, width: int, hidden: int, experts_count: int,
                 top_k: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(layers)])
        self.moes = nn.ModuleList([experts(width, hidden, experts_count, top_k) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        batch, length, width = x.shape
        for norm, moe in zip(self.norms, self.moes, strict=True):
            x = x + moe(norm(x).reshape(-1, width)).view(batch, length, width)
        return self.head(x)


class GroupedMoELM(MoELM):
    def __init__(self, vocab: int = 200, width: int = 32, hidden: int = 64, experts: int = 4, top_k: int = 2,
                 layers: int = 2) -> None:
        super().__init__(GroupedExperts, vocab, width, hidden, experts, top_k, layers)


class MaskedAttentionLM(nn.Module):
    """Attention that skips its mask when the padding mask is all ones, as transformers' SDPA path does: which
    branch runs, and so the memory, depends on the values of the inputs."""

    def __init__(self, vocab: int = 200, width: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.qkv = nn.ModuleList([nn.Linear(width, 3 * width) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, length = ids.shape
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, device=ids.device)
        if bool(attention_mask.sum() == attention_mask.numel()):  # no padding: causal flag, no mask tensor
            mask, causal = None, True
        else:
            keep = attention_mask.bool()[:, None, None, :]
            mask, causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril() & keep, False
        x = self.embed(ids)
        for qkv in self.qkv:
            q, k, v = qkv(x).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).transpose(1, 2).reshape(
                batch, length, -1)
        return self.head(x)


class TrimsPadding(nn.Module):
    """Reads the longest real length with `.item()` and drops the padding columns before the heavy part."""

    def __init__(self, vocab: int = 200, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, 8 * width), nn.GELU(), nn.Linear(8 * width, width))

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        longest = int(attention_mask.sum(-1).max().item())
        return self.mlp(self.embed(ids[:, :longest]))


class FrozenEmbedding(nn.Module):
    """Fine-tuning a head on a frozen embedding: frozen parameters get no gradient and no optimizer state."""

    def __init__(self, vocab: int = 500, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.embed.weight.requires_grad_(False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(ids)))


CALLS = {"window": 0}
"""State outside the model: what a decoder reading a global step counter sees."""


class CountingWindow(nn.Module):
    """Counts its calls, as a decoder with a key/value cache counts cached tokens, and takes the length of its
    window from the count: a shape computed from state that changes between forward and recompute."""

    def __init__(self, width: int, state: str) -> None:
        super().__init__()
        self.state = state
        self.calls = 0
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.state == "attribute":
            self.calls += 1
            count = self.calls
        else:
            CALLS["window"] += 1
            count = CALLS["window"]
        window = x.shape[1] - count % 2
        return x + F.pad(torch.tanh(self.proj(x[:, :window])), (0, 0, 0, x.shape[1] - window))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class DecoderLayer(nn.Module):
    def __init__(self, width: int, state: str) -> None:
        super().__init__()
        self.window = CountingWindow(width, state)
        self.cross = nn.Linear(width, width)
        self.block = Block(width)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.window(x)
        x = x + self.cross(memory.mean(1, keepdim=True))
        return self.block(x)


class EncoderDecoder(nn.Module):
    """An encoder of plain blocks and a decoder whose layers count their calls (`state`: "attribute" keeps the
    count in the module, "global" outside it)."""

    def __init__(self, vocab: int = 200, width: int = 64, layers: int = 3, state: str = "attribute") -> None:
        super().__init__()
        torch.manual_seed(0)
        CALLS["window"] = 0
        self.embed = nn.Embedding(vocab, width)
        self.encoder = nn.ModuleList([Block(width) for _ in range(layers)])
        self.decoder = nn.ModuleList([DecoderLayer(width, state) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        memory = self.embed(source)
        for block in self.encoder:
            memory = block(memory)
        x = self.embed(target)
        for layer in self.decoder:
            x = layer(x, memory)
        return self.head(x)


class ScalesItsInput(nn.Module):
    """Writes into the tensor it is given (the previous layer's output, which nothing saves) before using it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return torch.tanh(self.linear(x))


class InPlaceStack(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(width, width)
        self.scales = ScalesItsInput(width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.scales(self.first(x))))


class GrowsOnFirstCall(nn.Module):
    """Replaces a child on its first forward, as a model that picks its attention by the input's length does."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attention: nn.Module = nn.Identity()
        self.blocks = nn.Sequential(Block(width), Block(width), Block(width))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.attention, nn.Identity):
            self.attention = Block(x.shape[-1]).to(x.device)
        return self.head(self.blocks(self.attention(x)))


class LoopExperts(nn.Module):
    """Mixture of experts as eager code writes it: only the experts some token picked run, each on its tokens
    (`nonzero` of the routing mask, `torch.where`); how many tokens each computes depends on the router."""

    def __init__(self, width: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.experts_count, self.top_k = experts, top_k
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(
            [nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)) for _ in range(experts)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(self.router(x).softmax(-1), self.top_k)
        out = torch.zeros_like(x)
        mask = F.one_hot(chosen, self.experts_count).permute(2, 1, 0)
        hit = (mask.sum(dim=(-1, -2)) > 0).nonzero()
        for expert in hit:
            position, token = torch.where(mask[expert[0]])
            computed = self.experts[int(expert[0])](x[token]) * weights[token, position, None]
            out = out.index_add(0, token, computed)
        return out


class LoopMoELM(MoELM):
    def __init__(self, vocab: int = 200, width: int = 32, hidden: int = 128, experts: int = 4, top_k: int = 2,
                 layers: int = 2) -> None:
        super().__init__(LoopExperts, vocab, width, hidden, experts, top_k, layers)


class KeepsPositive(nn.Module):
    """Keeps only the positive activations (a boolean mask of values the weights decide) and works on those."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(width, 8 * width)
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.up(x)
        kept = hidden[hidden > 0]
        return (torch.exp(-kept * self.scale) * kept).sum()


class HashExperts(nn.Module):
    """Routes each token by its id (expert = id mod experts): the routing follows the inputs alone."""

    def __init__(self, vocab: int = 200, width: int = 32, hidden: int = 256, experts: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.experts_count = experts
        self.embed = nn.Embedding(vocab, width)
        self.experts = nn.ModuleList(
            [nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)) for _ in range(experts)]
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        x = self.embed(flat)
        out = torch.zeros_like(x)
        for expert in range(self.experts_count):
            (tokens,) = torch.where(flat % self.experts_count == expert)
            if tokens.numel():
                out = out.index_add(0, tokens, self.experts[expert](x[tokens]))
        return self.head(x + out)


class LayerDropStack(nn.Module):
    """Skips each layer with probability `layerdrop` in training, as transformers' LayerDrop does: which layers
    run, and so the memory, is drawn anew each step."""

    def __init__(self, layerdrop: float = 0.3, width: int = 64, layers: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layerdrop = layerdrop
        self.layers = nn.ModuleList([Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            x = layer(x)
        return self.head(x)


class DetachedStatistic(nn.Module):
    """Computes a branch with autograd on, then keeps only a detached statistic of it: nothing needs that part of
    the graph afterwards, and the step frees it (tanh saves its own output for backward)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.probe = nn.Linear(width, 4 * width)
        self.up = nn.Linear(width, 8 * width)
        self.down = nn.Linear(8 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tanh(self.probe(x)).detach().abs().mean()
        return self.down(torch.tanh(self.up(x))) * scale


class Reasoner(nn.Module):
    """Runs its two modules in cycles, every cycle but the last under no_grad, as recurrent reasoning models do:
    each module has calls that backward never reaches."""

    def __init__(self, width: int = 64, cycles: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cycles = cycles
        self.inp = nn.Linear(width, width)
        self.low = nn.Sequential(Block(width), Block(width))
        self.high = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inp(x)
        with torch.no_grad():
            for _ in range(self.cycles - 1):
                z = self.high(self.low(z))
        return self.head(self.high(self.low(z)))


class CarriesState(nn.Module):
    """A linear recurrence that starts from `self.state` and leaves its last state there (RecurrentGemma's RG-LRU):
    its parent resets the state before each call, so a rerun of this module alone starts from the wrong one."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, width)
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decay = torch.sigmoid(self.gate(x))
        state = torch.zeros_like(x[:, 0]) if self.state is None else self.state
        states = []
        for step in range(x.shape[1]):
            state = decay[:, step] * state + x[:, step]
            states.append(state)
        self.state = state
        return torch.stack(states, 1)


class RecurrentBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.scan = CarriesState(width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.scan.state = None  # training: no cache, every sequence starts afresh
        return x + self.out(self.scan(self.inp(x)))


class StatefulRecurrentLM(nn.Module):
    """Recurrent blocks whose scans keep their last state on the module."""

    def __init__(self, width: int = 32, layers: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([RecurrentBlock(width) for _ in range(layers)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class UnreadEncoding(nn.Module):
    """An encoder whose output the decoder never reads, returned beside the loss (transformers' EncoderDecoderModel
    with a decoder built without cross-attention): autograd keeps the encoder's graph until the output is dropped,
    though backward never reaches it."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(Block(width), Block(width), Block(width))
        self.decoder = nn.Sequential(Block(width), nn.Linear(width, 10))

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        encoding = self.encoder(source)
        loss = self.decoder(target).logsumexp(-1).mean()
        return {"loss": loss, "encoder_last_hidden_state": encoding}


class GatesOnItsWeights(nn.Module):
    """Branches in forward on a value of its weights: no fake step can decide it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear.weight.mean() > 0:
            return torch.tanh(self.linear(x))
        return self.linear(x)


class CTCRecognizer(nn.Module):
    """Frames in, characters out, trained with a CTC loss whose lengths come from the inputs' padding mask: the
    loss's kernel needs those lengths' values to size what it keeps for backward."""

    def __init__(self, features: int = 16, width: int = 64, characters: int = 20) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(features, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, characters)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_probs = self.head(self.encoder(frames)).log_softmax(-1).transpose(0, 1)
        input_lengths = mask.sum(-1)
        target_lengths = (labels > 0).sum(-1)
        return F.ctc_loss(log_probs, labels, input_lengths, target_lengths, blank=0, zero_infinity=True)


INSTANCE = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
"""A model built when its module is imported, named by a spec without a factory."""


def vit() -> nn.Module:
    return ViT().train()


def tied_lm() -> nn.Module:
    return TiedLM().train()


def shared_buffer() -> nn.Module:
    return SharedBuffer().train()


def reads_its_weights() -> nn.Module:
    return ReadsItsWeights().train()


def grouped_moe() -> nn.Module:
    return GroupedMoELM().train()


def masked_attention() -> nn.Module:
    return MaskedAttentionLM().train()


def trims_padding() -> nn.Module:
    return TrimsPadding().train()


def frozen_embedding() -> nn.Module:
    return FrozenEmbedding().train()


def encoder_decoder() -> nn.Module:
    return EncoderDecoder(state="attribute").train()


def encoder_decoder_global() -> nn.Module:
    return EncoderDecoder(state="global").train()


def in_place_stack() -> nn.Module:
    return InPlaceStack().train()


def grows_on_first_call() -> nn.Module:
    return GrowsOnFirstCall().train()


def loop_moe() -> nn.Module:
    return LoopMoELM().train()


def keeps_positive() -> nn.Module:
    return KeepsPositive().train()


def hash_experts() -> nn.Module:
    return HashExperts().train()


def reasoner() -> nn.Module:
    return Reasoner().train()


def stateful_recurrent() -> nn.Module:
    return StatefulRecurrentLM().train()


def unread_encoding() -> nn.Module:
    return UnreadEncoding().train()


def gates_on_its_weights() -> nn.Module:
    return GatesOnItsWeights().train()


def raises() -> nn.Module:
    raise ValueError("no such layer size: 7")
