"""Example models shipped with fsdpc, by built-in name.

A model factory returns ``(model, batch, loss_fn)``: the ``nn.Module`` to
train, an example batch (a tuple of tensors with the shapes every step will
use) and ``loss_fn(model, *batch)``, which returns the scalar loss. This is
the contract for ``python -m fsdpc export --model path/to/file.py:factory``
as well; factories take keyword options (``batch``, ``seq``) they may ignore.
"""

from fsdpc.models.convnet import make_convnet
from fsdpc.models.gpt import make_gpt, make_gpt_23m
from fsdpc.models.llama import make_llama, make_llama3_8b, make_llama3_70b, make_llama_0_9b, make_llama_2_6b
from fsdpc.models.mlp import make_mlp

BUILTIN_MODELS = {
    "mlp": make_mlp,
    "convnet": make_convnet,
    "gpt": make_gpt,
    "gpt-23m": make_gpt_23m,
    "llama": make_llama,
    "llama-0.9b": make_llama_0_9b,
    "llama-2.6b": make_llama_2_6b,
    "llama3-8b": make_llama3_8b,
    "llama3-70b": make_llama3_70b,
}

try:  # Hugging Face models exist only where `transformers` is installed.
    from fsdpc.models.hf import make_hf_gpt2, make_hf_llama
except ImportError:  # pragma: no cover - depends on the environment
    pass
else:
    BUILTIN_MODELS["hf-gpt2"] = make_hf_gpt2
    BUILTIN_MODELS["hf-llama"] = make_hf_llama

__all__ = ["BUILTIN_MODELS"]
