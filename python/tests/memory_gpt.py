"""A GPT big enough that its tensors, not allocator noise, make the peak
(about 1.6M parameters, 64-token sequences), small enough for a test."""

from fsdpc.models.gpt import GPTConfig, make_gpt

CONFIG = GPTConfig(vocab_size=2039, max_seq=64, d_model=128, n_heads=4, n_layers=3)


def make(batch: int = 2, **_options):
    return make_gpt(batch, 64, config=CONFIG)
