"""Tile sizes and launch parameters of the portable Triton kernels, as data.

One row per head-dim bucket; fp32 inputs use the smaller ``fp32`` rows (twice the bytes per element
and IEEE-precision dots). The same tiles are used on the CPU interpreter, so the interpreter tests
exercise exactly the tile tails the GPU sees.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jfa import knobs


@dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Configs:
    forward: KernelConfig
    dkdv: KernelConfig  # block_n: the KV tile a program owns; block_m: the Q tile it streams
    dq: KernelConfig  # block_m: the Q tile a program owns; block_n: the KV tile it streams


# key: (max head dim of the bucket, is_fp32)
_TABLE: dict[tuple[int, bool], Configs] = {
    # the 16-bit rows for D 64 and 128: the fastest of the variants measured on the H200 (NOTES.md)
    (32, False): Configs(KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 4, 3)),
    (64, False): Configs(KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 4, 3)),
    (128, False): Configs(KernelConfig(128, 64, 8, 3), KernelConfig(32, 128, 8, 3), KernelConfig(128, 32, 8, 3)),
    (256, False): Configs(KernelConfig(64, 32, 8, 2), KernelConfig(32, 64, 8, 1), KernelConfig(64, 32, 8, 1)),
    (32, True): Configs(KernelConfig(64, 32, 4, 2), KernelConfig(32, 64, 4, 2), KernelConfig(64, 32, 4, 2)),
    (64, True): Configs(KernelConfig(64, 32, 4, 2), KernelConfig(32, 64, 4, 2), KernelConfig(64, 32, 4, 2)),
    (128, True): Configs(KernelConfig(64, 32, 8, 1), KernelConfig(32, 32, 8, 1), KernelConfig(32, 32, 8, 1)),
    (256, True): Configs(KernelConfig(32, 16, 8, 1), KernelConfig(16, 32, 8, 1), KernelConfig(32, 16, 8, 1)),
}

MAX_HEAD_DIM = 256


def padded_head_dim(head_dim: int) -> int:
    """The power-of-two register width a head dim occupies (at least 16, the dot's minimum K)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _override() -> Configs | None:
    """``knobs.triton_config`` (``JFA_TRITON_CONFIG``) replaces the 16-bit rows: a tuning aid for
    benchmark sweeps."""
    rows = knobs.triton_config
    if not rows:
        return None
    try:
        return Configs(*(KernelConfig(*rows[name]) for name in ("forward", "dkdv", "dq")))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{knobs.KNOBS['triton_config'].env}: needs forward, dkdv and dq as "
                         f"[block_m, block_n, warps, stages] ({exc})") from None


def configs_for(head_dim: int, dtype: torch.dtype) -> Configs:
    """The launch configs for inputs of ``head_dim`` (1..256) and ``dtype``."""
    bucket = max(32, padded_head_dim(head_dim))
    override = _override() if dtype != torch.float32 else None
    return override or _TABLE[(bucket, dtype == torch.float32)]


def tile_sizes(head_dim: int, dtype: torch.dtype) -> list[int]:
    """Every tile size (rows) any portable kernel uses for these inputs: the lengths tests must hit."""
    c = configs_for(head_dim, dtype)
    return sorted({c.forward.block_m, c.forward.block_n, c.dkdv.block_m, c.dkdv.block_n, c.dq.block_m, c.dq.block_n})
