"""fsdpc: compile PyTorch training steps into fully sharded data-parallel code.

This package is the Python side of the compiler. Today it drives the
``fsdp-opt`` binary (:mod:`fsdpc.compiler`); graph capture and the training
runtime arrive in later releases.
"""

from fsdpc.compiler import FsdpOptError, find_fsdp_opt, run_fsdp_opt

__all__ = ["FsdpOptError", "find_fsdp_opt", "run_fsdp_opt"]
