"""Tiny models and state dicts, each named after the layout case it shows.

Every rule has a case that triggers it and one that must not. Weights are random
(seeded) so that duplicate detection sees real, non-constant contents.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

torch.manual_seed(0)

# Large enough to clear ML102's 4 KiB default threshold.
VOCAB, WIDTH = 64, 32


class TiedEmbeddingLM(nn.Module):
    """An embedding and an output head that share one Parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight


class LostTieLM(nn.Module):
    """The head holds a copy of the embedding: the tie was lost, contents still equal."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = nn.Parameter(self.embed.weight.detach().clone())


class DivergedHeadLM(nn.Module):
    """Embedding and head separate and different: a declared tie would lose the head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)


class TransposedTieAutoencoder(nn.Module):
    """The decoder weight is a transposed view of the encoder weight: a deliberate tie."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(VOCAB, WIDTH, bias=False)
        self.register_buffer("decoder_weight", self.encoder.weight.detach().t())


def assign_loaded_tied_lm() -> nn.Module:
    """A tied model after load_state_dict(assign=True): two Parameters, one storage."""
    model = TiedEmbeddingLM()
    state = model.state_dict()
    fresh = TiedEmbeddingLM()
    fresh.load_state_dict(state, assign=True)
    return fresh


class TransposedWeightLinear(nn.Module):
    """A Linear whose weight Parameter is a transposed (non-contiguous) view."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.proj.weight = nn.Parameter(self.proj.weight.detach().t())


class ExpandedBufferModule(nn.Module):
    """A buffer made by expand(): every row aliases the same memory."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(1, WIDTH).expand(8, WIDTH))


class ContiguousBufferModule(nn.Module):
    """The same table, materialized."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(1, WIDTH).expand(8, WIDTH).contiguous())


def channels_last_convnet() -> nn.Module:
    """A conv net converted whole to channels_last."""
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)).to(memory_format=torch.channels_last)


def mixed_format_convnet() -> nn.Module:
    """One conv channels_last, the other not."""
    net = channels_last_convnet()
    conv = net[0]
    assert isinstance(conv, nn.Conv2d)
    conv.weight.data = conv.weight.data.contiguous()
    return net


def pointwise_mixed_convnet() -> nn.Module:
    """1x1 convs only: contiguous and channels_last at once, so no mix to report."""
    net = nn.Sequential(nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 1))
    net[0].to(memory_format=torch.channels_last)
    return net


def misaligned_state() -> dict[str, torch.Tensor]:
    """A tensor starting 4 bytes into its storage."""
    base = torch.randn(1025)
    return {"w": base[1:]}


def aligned_slices_state() -> dict[str, torch.Tensor]:
    """Two halves of one storage, each starting on a 16-byte boundary."""
    base = torch.randn(1024)
    return {"a": base[:512], "b": base[512:]}


def partial_overlap_state() -> dict[str, torch.Tensor]:
    """Two windows of one storage that share four elements."""
    base = torch.randn(16)
    return {"first": base[:10], "second": base[6:]}


def flat_buffer_with_views_state() -> dict[str, torch.Tensor]:
    """A flat buffer saved beside its disjoint views (the getParameters pattern)."""
    flat = torch.randn(64)
    return {"flat": flat, "w": flat[:32].view(4, 8), "b": flat[32:]}


def sliced_bloat_state() -> dict[str, torch.Tensor]:
    """A 10-element slice of a 10,000-element tensor: torch.save writes all 40 KB."""
    return {"scale": torch.randn(10_000)[:10]}


def cloned_slice_state() -> dict[str, torch.Tensor]:
    """The same slice, cloned: its storage is exactly its size."""
    return {"scale": torch.randn(10_000)[:10].clone()}


def fragmented_mlp() -> nn.Module:
    """Six parameters in six storages."""
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))


def pack_into_one_buffer(tensors: list[torch.Tensor], start: int = 0) -> None:
    """Re-point each tensor at consecutive elements of one new buffer, from element `start`."""
    flat = torch.empty(start + sum(t.numel() for t in tensors))
    offset = start
    for tensor in tensors:
        count = tensor.numel()
        flat[offset : offset + count].copy_(tensor.detach().reshape(-1))
        tensor.data = flat[offset : offset + count].view_as(tensor)
        offset += count


def hand_flattened_mlp() -> nn.Module:
    """The same MLP with every parameter a view into one buffer."""
    model = fragmented_mlp()
    pack_into_one_buffer(list(model.parameters()))
    return model


def cpu_lstm() -> nn.LSTM:
    """A two-layer LSTM as constructed on the CPU: one storage per weight."""
    return nn.LSTM(8, 8, num_layers=2)


def cudnn_buffer_order(rnn: nn.RNNBase) -> list[str | int]:
    """The RNN's weights in the order cuDNN's buffer holds them, as ONNX's OptimizedRNN
    and MXNet's fused RNN concatenate them: weight-or-bias outermost, then layer, then
    direction, then input/hidden(/projection). An int stands for bias space that an
    RNN without bias leaves (its element count): cuDNN keeps it all the same."""
    gates = {"LSTM": 4, "GRU": 3}.get(rnn.mode, 1)
    entries: list[str | int] = []
    for kind, parts in (("weight", ("ih", "hh", "hr")), ("bias", ("ih", "hh"))):
        for layer in range(rnn.num_layers):
            for suffix in ("", "_reverse")[: 2 if rnn.bidirectional else 1]:
                for part in parts:
                    name = f"{kind}_{part}_l{layer}{suffix}"
                    if name in rnn._flat_weights_names:
                        entries.append(name)
                    elif kind == "bias":
                        entries.append(gates * rnn.hidden_size)
    return entries


def pack_like_cudnn(rnn: nn.RNNBase, start: int = 0) -> None:
    """Re-point the RNN's weights at one new buffer in cuDNN's order, from element `start`."""
    entries = cudnn_buffer_order(rnn)
    sizes = [e if isinstance(e, int) else getattr(rnn, e).numel() for e in entries]
    flat = torch.zeros(start + sum(sizes), dtype=rnn.weight_ih_l0.dtype)
    offset = start
    for entry, size in zip(entries, sizes, strict=True):
        if isinstance(entry, str):
            tensor = getattr(rnn, entry)
            flat[offset : offset + size].copy_(tensor.detach().reshape(-1))
            tensor.data = flat[offset : offset + size].view_as(tensor)
        offset += size
    rnn._init_flat_weights()


def cudnn_flat_lstm() -> nn.LSTM:
    """The LSTM with its weights where cuDNN puts them: every matrix, then every bias."""
    lstm = cpu_lstm()
    pack_like_cudnn(lstm)
    return lstm


def names_order_lstm() -> nn.LSTM:
    """The LSTM packed in `_flat_weights_names` order (w_ih, w_hh, b_ih, b_hh per layer):
    one chunk, but not where cuDNN expects its weights once there are two layers."""
    lstm = cpu_lstm()
    pack_into_one_buffer([getattr(lstm, name) for name in lstm._flat_weights_names])
    return lstm


class WeightDropLSTM(nn.Module):
    """The awd-lstm weight-dropout wrapper: the hidden weight is a plain tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 8)
        raw = self.lstm.weight_hh_l0
        del self.lstm._parameters["weight_hh_l0"]
        self.weight_hh_l0_raw = nn.Parameter(raw.detach().clone())
        # What the wrapper does before every forward.
        self.lstm.weight_hh_l0 = nn.functional.dropout(self.weight_hh_l0_raw, p=0.5)


def meta_and_cpu_state() -> dict[str, torch.Tensor]:
    """Half materialized: one tensor still on the meta device."""
    return {"done": torch.randn(4, 4), "pending": torch.empty(4, 4, device="meta")}


def cpu_state_with_scalar_step() -> dict[str, Any]:
    """A training checkpoint whose only odd device would be a 0-d step counter."""
    return {"model": {"w": torch.randn(4, 4)}, "step": torch.tensor(3.0)}


def mixed_dtype_mlp() -> nn.Module:
    """A float32 layer left in a bfloat16 model."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)).to(torch.bfloat16)
    model[1].to(torch.float32)
    return model


def bf16_model_with_fp32_optimizer_state() -> dict[str, Any]:
    """bf16 parameters, float32 Adam moments: the moments are not the model's dtype mix."""
    model = nn.Linear(8, 8).to(torch.bfloat16)
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.Adam(master)
    for p in master:
        p.grad = torch.ones_like(p)
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def nan_state() -> dict[str, torch.Tensor]:
    """A float32 tensor with a NaN and a bfloat16 tensor with an Inf."""
    w = torch.randn(64)
    w[7] = float("nan")
    h = torch.randn(64).to(torch.bfloat16)
    h[3] = float("inf")
    return {"w": w, "h": h, "ok": torch.randn(64)}


def constant_tensors_state() -> dict[str, torch.Tensor]:
    """Freshly initialized norm weights: equal, large, constant — never duplicates."""
    return {"norm1.weight": torch.ones(2048), "norm2.weight": torch.ones(2048), "bias": torch.zeros(2048)}


def one_finding_of_each_severity_state() -> dict[str, torch.Tensor]:
    """ML101 (error): two slices overlap; ML201 (warning): a transposed matrix; ML203 (info): a view 4 bytes in."""
    base = torch.arange(64, dtype=torch.float32)
    shifted = torch.arange(65, dtype=torch.float32)
    return {
        "encoder.left": base[0:40],
        "encoder.right": base[20:64],
        "proj.weight": torch.arange(64, dtype=torch.float32).reshape(8, 8).t(),
        "norm.shifted": shifted[1:],
    }


def tiny_gpt2() -> nn.Module:
    """GPT-2 with its output head tied to the token embedding, built from a config (no download)."""
    import transformers  # only the tests that build real architectures need it

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model
