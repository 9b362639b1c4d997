"""Pure NumPy float64 oracle (no torch): the ground truth kernels are checked against."""

from .attention import attention_backward, attention_forward

__all__ = ["attention_forward", "attention_backward"]
