"""Portable Triton kernels: the same source runs compiled on CUDA and interpreted on CPU tensors.

Triton's interpreter is process-wide: ``triton.jit`` (Triton's own standard library included) picks
compiled or interpreted code when a module is imported, from ``TRITON_INTERPRET``. So CPU runs need
``TRITON_INTERPRET=1`` in the environment before triton is first imported; jfa's CLI and test suite
set it, and :func:`interpreter_active` tells whether this process has it.
"""
from __future__ import annotations

from jfa.kernels.triton.configs import configs_for, tile_sizes


def interpreter_active() -> bool:
    """True when this process's Triton runs kernels in the interpreter (decided at triton's import)."""
    import triton.language.standard as standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.zeros, InterpretedFunction)


__all__ = ["configs_for", "tile_sizes", "interpreter_active"]
