"""Hand-picked adversarial cases: the fixed part of the correctness suite (tests, gate, GPU runs).

Each family targets one way a jagged kernel goes wrong: empty sequences (leading, trailing, runs,
all, B = 0), length 1, lengths at every tile size -1/0/+1 (read from the kernels' configs, so the
suite follows the configs), Lq != Lk both ways with causal (fully masked rows), broadcast-Q, every
head dim and dtype, saturated softmax, strided views, int64 offsets, explicit scales.
"""
from __future__ import annotations

from jfa.kernels.triton.configs import tile_sizes
from jfa.testing import DTYPES, Case, replace

HEAD_DIMS = (16, 32, 64, 128, 256)


def tail_lengths(block: int) -> tuple:
    return (block - 1, block, block + 1)


def structural_cases(dtype: str = "bf16", head_dim: int = 32) -> list:
    """Offsets and masking edge cases for one dtype and head dim."""
    base = Case((), (), head_dim=head_dim, dtype=dtype)
    cases = [
        replace(base, lengths_q=(0, 17, 40), lengths_k=(0, 23, 40), name="empty-leading"),
        replace(base, lengths_q=(17, 40, 0), lengths_k=(23, 40, 0), name="empty-trailing"),
        replace(base, lengths_q=(5, 0, 0, 0, 9), lengths_k=(7, 0, 0, 0, 3), name="empty-run-middle"),
        replace(base, lengths_q=(0, 0, 0), lengths_k=(0, 0, 0), name="all-empty"),
        replace(base, lengths_q=(), lengths_k=(), name="batch-zero"),
        replace(base, lengths_q=(0, 5), lengths_k=(7, 0), name="q-empty-or-k-empty"),
        replace(base, lengths_q=(1, 1, 1), lengths_k=(1, 1, 1), name="all-length-one"),
        replace(base, lengths_q=(1, 1), lengths_k=(1, 1), causal=True, name="all-length-one-causal"),
        replace(base, lengths_q=(100, 37), lengths_k=(20, 5), causal=True, name="causal-lq-gt-lk"),
        replace(base, lengths_q=(20, 5), lengths_k=(100, 37), causal=True, name="causal-lq-lt-lk"),
        replace(base, lengths_q=(30, 130), lengths_k=(129, 1), name="cross-lq-ne-lk"),
        replace(base, lengths_q=(300, 5), lengths_k=(260, 400), causal=True, name="multi-tile-causal"),
        replace(base, lengths_q=(300, 5), lengths_k=(260, 400), name="multi-tile"),
        replace(base, lengths_q=(70,), lengths_k=(3, 0, 130, 64), broadcast_q=True, name="bcastq"),
        replace(base, lengths_q=(70,), lengths_k=(3, 0, 130, 64), broadcast_q=True, causal=True,
                name="bcastq-causal"),
        replace(base, lengths_q=(1,), lengths_k=(1, 200), broadcast_q=True, name="bcastq-lq1"),
        replace(base, lengths_q=(129,), lengths_k=(1, 200, 0), broadcast_q=True, causal=True,
                name="bcastq-lq129-causal"),
        replace(base, lengths_q=(0,), lengths_k=(5, 6), broadcast_q=True, name="bcastq-lq0"),
        replace(base, lengths_q=(90, 45), lengths_k=(90, 60), causal=True, q_scale=20.0, name="saturated-qx20"),
        replace(base, lengths_q=(90, 45), lengths_k=(90, 60), causal=True, strided=True, name="strided-fused-qkv"),
        replace(base, lengths_q=(50, 0, 70), lengths_k=(60, 9, 70), offsets_dtype="int64", name="int64-offsets"),
        replace(base, lengths_q=(40, 80), lengths_k=(80, 40), softmax_scale=0.3, causal=True, name="scale-0.3"),
        replace(base, lengths_q=(40, 80), lengths_k=(80, 40), softmax_scale=-1.7, name="scale-neg1.7"),
    ]
    for block in tile_sizes(head_dim, DTYPES[dtype]):
        lens = tail_lengths(block)
        cases.append(replace(base, lengths_q=lens, lengths_k=lens, name=f"tails-{block}"))
        cases.append(replace(base, lengths_q=lens, lengths_k=lens[::-1], causal=True, name=f"tails-{block}-causal"))
    return [replace(c, name=f"{c.name}-{dtype}-D{head_dim}") for c in cases]


def head_dim_cases(dtype: str) -> list:
    """Every supported head dim (powers of two and an odd one), causal and cross-length."""
    return [Case((33, 70), (70, 33), head_dim=d, dtype=dtype, causal=True, heads=2, name=f"headdim-{d}-{dtype}")
            for d in HEAD_DIMS + (40,)]


def default_suite() -> list:
    """The full fixed suite: structure in bf16 and fp32 (and a slice in fp16), every head dim per dtype."""
    cases = structural_cases("bf16", 32) + structural_cases("fp32", 64)
    cases += [c for c in structural_cases("fp16", 128) if "tails" in c.name or "causal" in c.name]
    for dtype in DTYPES:
        cases += head_dim_cases(dtype)
    return cases
