"""A GPT-style decoder of our own: pre-norm blocks, learned positions, tied
input/output embeddings, and a vocabulary (1021, prime) that no power of two
divides, so dim-0 shards of the embedding are uneven on every rank count."""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fsdpc.models.language import next_token_loss, token_batch


@dataclass
class GPTConfig:
    vocab_size: int = 1021
    max_seq: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.register_buffer("causal_mask", torch.empty(config.max_seq, config.max_seq, dtype=torch.bool),
                             persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fills the causal mask (also after a model built on the meta
        device is materialized)."""
        with torch.no_grad():
            self.causal_mask.copy_(torch.tril(torch.ones_like(self.causal_mask)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        head = width // self.n_heads
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_heads, head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head)
        scores = scores.masked_fill(~self.causal_mask[:seq, :seq], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialization: weights and embeddings normal(0, 0.02),
        biases zero, layer norms identity, and the projections that write
        into the residual stream scaled by 1/sqrt(2 x layers), so that the
        first loss is near ln(vocab)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn.proj", "mlp.2")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# The 23M-parameter configuration the benchmarks use.
GPT_23M = GPTConfig(vocab_size=8191, max_seq=128, d_model=512, n_heads=8, n_layers=6)


def make_gpt(batch: int = 2, seq: int = 16, config: GPTConfig = GPTConfig(), **_options):
    if not 1 <= seq <= config.max_seq:
        raise ValueError(f"gpt: seq must be in [1, {config.max_seq}], got {seq}")
    model = GPT(config)
    return model, token_batch(config.vocab_size, batch, seq), next_token_loss


def make_gpt_23m(batch: int = 4, seq: int = 128, **options):
    return make_gpt(batch, seq, config=GPT_23M, **options)
