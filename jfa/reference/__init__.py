"""PyTorch references: the `backend="torch"` implementation and the tolerance-rule baseline."""

from .torch_ref import attention_reference, kv_block_masks

__all__ = ["attention_reference", "kv_block_masks"]
