"""Example models shipped with fsdpc, by built-in name.

A model factory returns ``(model, batch, loss_fn)``: the ``nn.Module`` to
train, an example batch (a tuple of tensors with the shapes every step will
use) and ``loss_fn(model, *batch)``, which returns the scalar loss. This is
the contract for ``python -m fsdpc export --model path/to/file.py:factory``
as well; factories take keyword options (``batch``, ``seq``) they may ignore.
"""

import importlib.util

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


def _hugging_face(factory: str):
    """`fsdpc.models.hf`'s `factory`, imported when called: importing
    `transformers` costs a second, which every command would pay."""
    def make(**options):
        from fsdpc.models import hf

        return getattr(hf, factory)(**options)

    make.__name__ = make.__qualname__ = factory
    return make


if importlib.util.find_spec("transformers") is not None:  # Hugging Face models exist only where it is installed
    BUILTIN_MODELS["hf-gpt2"] = _hugging_face("make_hf_gpt2")
    BUILTIN_MODELS["hf-llama"] = _hugging_face("make_hf_llama")

__all__ = ["BUILTIN_MODELS"]
