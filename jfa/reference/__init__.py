"""PyTorch references: the `backend="torch"` implementation and the tolerance-rule baseline."""

from .torch_ref import (attention_reference, kv_block_lists, listed_keys, row_chunks,
                        select_kv_blocks_reference)

__all__ = ["attention_reference", "kv_block_lists", "listed_keys", "row_chunks", "select_kv_blocks_reference"]
