"""Pure NumPy float64 oracle (no torch): the ground truth kernels are checked against. Attention
forward and backward (dense, and restricted to block lists), block selection, the MX quantizer."""

from .attention import attention_backward, attention_forward
from .block_select import select_kv_blocks, validate_kv_blocks

__all__ = ["attention_forward", "attention_backward", "select_kv_blocks", "validate_kv_blocks"]
