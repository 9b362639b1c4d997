"""jfa: Jagged FlashAttention over packed variable-length batches, and the harness that proves it right.

``jfa.jagged_attention`` is the op (its docstring is the contract), ``jfa.block_sparse_attention`` its
block-sparse sibling (``jfa.select_kv_blocks`` the selection it runs); ``jfa.which_kernels`` says which
kernels a call runs; ``jfa.knobs`` holds every setting; ``jfa.mx`` the MXFP8 tensor type and quantizer (``precision="mxfp8"``). The harness (``jfa.oracle``, ``jfa.reference``,
``jfa.fuzz``, ``jfa.bench``) is imported on its own. Importing jfa touches no GPU and does not import
Triton.
"""
from jfa import knobs, mx
from jfa.api import (KernelChoice, block_sparse_attention, jagged_attention, recording_dispatch, select_kv_blocks,
                     which_kernels)

__version__ = "0.1.0"
__all__ = ["jagged_attention", "block_sparse_attention", "select_kv_blocks", "which_kernels", "KernelChoice", "recording_dispatch", "knobs", "mx", "__version__"]
