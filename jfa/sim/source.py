"""Kernel source locations: which Python frames are kernel code, and how a location is shown.

The rewriter (``rewrite.py``) registers the code object of every function it compiles (the kernel, its
``@triton.jit`` helpers and the closures its ``async_task`` regions become). An op captures its location
by walking the calling frames and keeping the registered ones: a ``Site`` is that tuple of
(code, line) pairs, innermost first. Capturing costs a frame walk (a few microseconds); formatting
happens only when a report or a trace is rendered.
"""
from __future__ import annotations

import os
import sys

_KERNEL_CODES: dict = {}  # code object -> display name of its function


def register_code(code, display: str) -> None:
    _KERNEL_CODES[code] = display


def is_kernel_code(code) -> bool:
    return code in _KERNEL_CODES


def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


class Site:
    """Where an op ran: the kernel frames of its call stack, innermost first."""

    __slots__ = ("frames",)

    def __init__(self, frames: tuple):
        self.frames = frames

    def __bool__(self) -> bool:
        return bool(self.frames)

    @property
    def line(self) -> int:
        return self.frames[0][1] if self.frames else 0

    @property
    def filename(self) -> str:
        return self.frames[0][0].co_filename if self.frames else ""

    @property
    def function(self) -> str:
        return _KERNEL_CODES.get(self.frames[0][0], self.frames[0][0].co_name) if self.frames else ""

    @staticmethod
    def _frame(code, line) -> str:
        return f"{_short_path(code.co_filename)}:{line} in {_KERNEL_CODES.get(code, code.co_name)}"

    def short(self) -> str:
        """The innermost frame: ``file:line in function``."""
        return self._frame(*self.frames[0]) if self.frames else "<no kernel frame>"

    def format(self, indent: str = "  ", limit: int = 8) -> str:
        """Innermost frame first, then its callers, one per line."""
        if not self.frames:
            return "<no kernel frame>"
        parts = [self._frame(*self.frames[0])]
        for code, line in self.frames[1:limit]:
            parts.append(f"{indent}called from {self._frame(code, line)}")
        if len(self.frames) > limit:
            parts.append(f"{indent}... {len(self.frames) - limit} more")
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"Site({self.short()})"

    def same_line(self, other: "Site") -> bool:
        return bool(self.frames) and bool(other.frames) and self.frames[0] == other.frames[0]


NO_SITE = Site(())


def capture(skip: int = 1) -> Site:
    """The kernel frames of the calling thread's stack, innermost first."""
    codes = _KERNEL_CODES
    f = sys._getframe(skip)
    out = []
    while f is not None:
        c = f.f_code
        if c in codes:
            out.append((c, f.f_lineno))
        f = f.f_back
    return Site(tuple(out))


def capture_frame(frame) -> Site:
    """The kernel frames of another thread's stack, given its innermost frame."""
    codes = _KERNEL_CODES
    out = []
    while frame is not None:
        if frame.f_code in codes:
            out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return Site(tuple(out))


def from_traceback(tb) -> Site:
    """The kernel frames of an exception's traceback, innermost first."""
    out = []
    while tb is not None:
        if tb.tb_frame.f_code in _KERNEL_CODES:
            out.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return Site(tuple(reversed(out)))
