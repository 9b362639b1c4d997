"""A small cache for host-side work derived from offset tensors (tile lists, validation).

Models call the op once per layer with the same ``cu_seqlens`` tensors, forward and backward. Work
derived from those tensors (a validation read-back that synchronises with the GPU, the ~20 small
launches of a tile list) need not be repeated: results are keyed by the identity of the tensors,
their version counter (bumped by every in-place write) and storage pointer, and are only reused
while the very same tensor objects are alive and unmodified. A new batch means new tensors, so at
most one build per batch instead of one per call.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch


class IdentityCache:
    def __init__(self, capacity: int = 64):
        self._capacity = capacity
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(tensors, extra) -> tuple:
        return tuple((id(t), t._version, t.data_ptr(), t.device) for t in tensors) + tuple(extra)

    def get_or_build(self, tensors: tuple, extra: tuple, build):
        """``build()`` once per (tensors as they are now, extra); later calls return the same value."""
        if any(not isinstance(t, torch.Tensor) for t in tensors):
            return build()
        key = self._key(tensors, extra)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and all(ref() is t for ref, t in zip(hit[0], tensors)):
                self._entries.move_to_end(key)
                return hit[1]
        value = build()
        with self._lock:
            self._entries[key] = (tuple(weakref.ref(t) for t in tensors), value)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
