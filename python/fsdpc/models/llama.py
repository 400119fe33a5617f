"""A Llama-3-style decoder of our own: RMSNorm, rotary positions, grouped-query
attention, SwiGLU feed-forward, untied output head. Besides the small test
model, it comes in the shapes the GPU benchmark and the planner use: 0.886B
and 2.61B (the GPU issue's measurements), Llama-3.1-8B's and Llama-3-70B's
(70,553,706,496 parameters), the big ones meant to be captured on the meta
device."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fsdpc.models.language import next_token_loss, token_batch


@dataclass
class LlamaConfig:
    vocab_size: int = 509
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 160
    max_seq: int = 64
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    # torch's nn.RMSNorm (torchtitan's norm; on a GPU one fused kernel each
    # way) instead of the written-out RMSNorm the benchmarks ran.
    torch_norm: bool = False


LLAMA_0_9B = LlamaConfig(vocab_size=32000, dim=2048, n_layers=16, n_heads=16, n_kv_heads=8,
                         ffn_dim=5632, max_seq=2048)
LLAMA_2_6B = LlamaConfig(vocab_size=32000, dim=3072, n_layers=24, n_heads=24, n_kv_heads=8,
                         ffn_dim=8192, max_seq=2048)
LLAMA3_8B = LlamaConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32,
                        n_kv_heads=8, ffn_dim=14336, max_seq=8192)
LLAMA3_70B = LlamaConfig(vocab_size=128256, dim=8192, n_layers=80, n_heads=64,
                         n_kv_heads=8, ffn_dim=28672, max_seq=8192)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.dim // config.n_heads
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def make_norm(config: LlamaConfig) -> nn.Module:
    return nn.RMSNorm(config.dim, eps=config.norm_eps) if config.torch_norm else RMSNorm(config.dim, config.norm_eps)


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = make_norm(config)
        self.attention = Attention(config)
        self.ffn_norm = make_norm(config)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig = LlamaConfig(), rope_len: int | None = None):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = make_norm(config)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        head_dim = config.dim // config.n_heads
        positions = torch.arange(rope_len or config.max_seq, dtype=torch.float32)
        inv_freq = config.rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(positions, inv_freq).repeat(1, 2)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))




def _make(config: LlamaConfig, batch: int, seq: int):
    if not 1 <= seq <= config.max_seq:
        raise ValueError(f"llama: seq must be in [1, {config.max_seq}], got {seq}")
    model = Llama(config, rope_len=seq)
    return model, token_batch(config.vocab_size, batch, seq), next_token_loss


def make_llama(batch: int = 2, seq: int = 16, **_options):
    return _make(LlamaConfig(), batch, seq)


def make_llama_0_9b(batch: int = 4, seq: int = 2048, **_options):
    return _make(LLAMA_0_9B, batch, seq)


def make_llama_2_6b(batch: int = 2, seq: int = 2048, **_options):
    return _make(LLAMA_2_6B, batch, seq)


def make_llama3_8b(batch: int = 2, seq: int = 8192, **_options):
    return _make(LLAMA3_8B, batch, seq)


def make_llama3_70b(batch: int = 1, seq: int = 16, **_options):
    return _make(LLAMA3_70B, batch, seq)
