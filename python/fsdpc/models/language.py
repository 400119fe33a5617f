"""What the language models share: next-token cross-entropy and a random
token batch of the shapes every step uses."""

import torch
import torch.nn.functional as F


def cross_entropy_over_tokens(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def next_token_loss(model, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return cross_entropy_over_tokens(model(tokens), targets)


def token_batch(vocab_size: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randint(0, vocab_size, (batch, seq)),
            torch.randint(0, vocab_size, (batch, seq)))
