"""jfa: Jagged FlashAttention over packed variable-length batches, and the harness that proves it right.

``jfa.jagged_attention`` is the op (DESIGN.md section 3); ``jfa.oracle`` the float64 NumPy oracle;
``jfa.reference`` the PyTorch reference. Importing jfa touches no GPU.
"""
from jfa.api import KernelChoice, jagged_attention, which_kernels

__version__ = "0.1.0"
__all__ = ["jagged_attention", "which_kernels", "KernelChoice", "__version__"]
