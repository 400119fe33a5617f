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
        mask = torch.tril(torch.ones(config.max_seq, config.max_seq, dtype=torch.bool))
        self.register_buffer("causal_mask", mask, persistent=False)

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

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))




def make_gpt(batch: int = 2, seq: int = 16, **_options):
    config = GPTConfig()
    if not 1 <= seq <= config.max_seq:
        raise ValueError(f"gpt: seq must be in [1, {config.max_seq}], got {seq}")
    model = GPT(config)
    return model, token_batch(config.vocab_size, batch, seq), next_token_loss
