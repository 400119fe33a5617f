"""Llama 3.1 8B as torchtitan trains it in its published FSDP runs: the same
decoder as the built-in `llama3-8b` with torchtitan's norm, `nn.RMSNorm`
(one fused kernel each way on a GPU), and torchtitan's loss, cross-entropy
over the logits cast to fp32 (`cross_entropy(pred.flatten(0, 1).float(),
labels.flatten(0, 1))`), which holds fp32 logits and their log-softmax where
the built-in loss keeps them in the compute dtype. For `fsdpc plan --model
examples/torchtitan_llama3_8b.py:make` (README, "Checked against
measurements").
"""

import dataclasses

import torch.nn.functional as F

from fsdpc.models.language import token_batch
from fsdpc.models.llama import LLAMA3_8B, Llama, LlamaConfig


def torchtitan_loss(model, tokens, labels):
    return F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten(0, 1))


def make(batch: int = 2, seq: int = 8192, config: LlamaConfig = dataclasses.replace(LLAMA3_8B, torch_norm=True),
         **_options):
    return Llama(config, rope_len=seq), token_batch(config.vocab_size, batch, seq), torchtitan_loss
