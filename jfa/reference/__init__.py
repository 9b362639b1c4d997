"""PyTorch references: the `backend="torch"` implementation and the tolerance-rule baseline."""

from .torch_ref import attention_reference

__all__ = ["attention_reference"]
