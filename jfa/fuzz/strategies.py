"""Hypothesis strategies that draw whole jagged attention problems (:class:`jfa.fuzz.cases.Case`).

Lengths come from a mixture of distributions chosen to break jagged kernels: uniform, log-normal long
tail, one giant among many tiny, all equal, powers of two, lengths at k*BLOCK-1 / k*BLOCK / k*BLOCK+1
for every tile size the kernels use (read from their configs), empty sequences anywhere (runs, all
empty, B = 0), length 1. On top: cross attention (Lq != Lk both ways), causal with Lq > Lk (fully
masked rows), broadcast-Q, value recipes (normal, saturated Q, near ties, equal keys, one dominant
key, subnormal), grouped key/value heads (GQA, MQA), sliding windows (one side, both), strided views,
the gradient layouts training loops produce (expanded, transposed,
sliced, from ``.sum()``), head dims, dtypes, explicit softmax scales, int32/int64 offsets.

Every draw shrinks towards the simplest problem (few short sequences, bf16, D=32, normal values), so a
failure ends as a small, readable case. ``max_tokens`` bounds the size per side: small for the CPU
interpreter, large for GPU fuzzing.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from jfa.kernels.triton.configs import tile_sizes
from jfa.fuzz.cases import DOUT_LAYOUTS, DTYPES, VALUE_RECIPES, Case, replace

CPU_MAX_TOKENS = 640
GPU_MAX_TOKENS = 24_000
TLX_HEAD_DIMS = (64, 128)  # what the TLX kernels take: problems(**TLX_ONLY) draws nothing they refuse
# block-sparse draws at the TLX kernels' block (128) only
TLX_ONLY = dict(head_dims=TLX_HEAD_DIMS, dtypes=("bf16", "fp16"), sparse_blocks=(128,))


def _boundary_lengths(blocks, max_len: int) -> list:
    values = {b * m + d for b in blocks for m in (1, 2, 3) for d in (-1, 0, 1)}
    return sorted(x for x in values if 0 <= x <= max_len)


@st.composite
def sequence_lengths(draw, blocks=(64, 128), max_batch: int = 8, max_tokens: int = CPU_MAX_TOKENS):
    """A list of sequence lengths (possibly empty) whose sum stays within ``max_tokens``."""
    if max_batch == 0:
        return ()
    max_len = max(1, max_tokens // 2)
    boundary = _boundary_lengths(blocks, max_len)
    powers = [1 << i for i in range(0, int(math.log2(max_len)) + 1)]
    one_length = st.one_of(
        st.integers(0, max_len),                      # uniform
        st.sampled_from(boundary),                    # tile tails: k*BLOCK-1, k*BLOCK, k*BLOCK+1
        st.sampled_from([0, 0, 1]),                   # empty and length-1 sequences, often
        st.sampled_from(powers),                      # powers of two
        st.floats(0.0, math.log(max_len)).map(lambda x: int(math.exp(x))),  # log-normal-ish long tail
    )
    shape = draw(st.sampled_from(["mixed", "equal", "giant-among-tiny", "all-empty"]))
    if shape == "mixed":
        lengths = draw(st.lists(one_length, min_size=0, max_size=max_batch))
    elif shape == "equal":
        lengths = [draw(one_length)] * draw(st.integers(1, max_batch))
    elif shape == "giant-among-tiny":
        tiny = draw(st.lists(st.integers(0, 3), min_size=0, max_size=max_batch - 1))
        lengths = tiny[:]
        lengths.insert(draw(st.integers(0, len(tiny))), draw(st.integers(max_len // 2, max_len)))
    else:
        lengths = [0] * draw(st.integers(0, max_batch))
    # keep the problem within budget by trimming the longest sequences (keeps the shape of the draw)
    while sum(lengths) > max_tokens:
        i = max(range(len(lengths)), key=lengths.__getitem__)
        lengths[i] = lengths[i] // 2
    return tuple(lengths)


def _relate(draw, lengths_k, blocks, max_tokens):
    """Query lengths for the same batch: equal, shorter, longer or independent of the key lengths."""
    relation = draw(st.sampled_from(["same", "shorter", "longer", "independent"]))
    if relation == "same":
        return tuple(lengths_k)
    if relation == "independent":
        other = draw(sequence_lengths(blocks, max_batch=len(lengths_k), max_tokens=max_tokens))
        return tuple((list(other) + [0] * len(lengths_k))[:len(lengths_k)])
    delta = draw(st.integers(1, max(blocks) + 1))
    if relation == "shorter":
        return tuple(max(0, n - delta) for n in lengths_k)
    out = [n + delta for n in lengths_k]
    while sum(out) > max_tokens:
        i = max(range(len(out)), key=out.__getitem__)
        out[i] //= 2
    return tuple(out)


SPARSE_SHARE = 0.25  # of problems(): block-sparse draws (the rest dense attention)


@st.composite
def problems(draw, max_tokens: int = CPU_MAX_TOKENS, head_dims=(32, 16, 64, 40, 128, 256),
             dtypes=("bf16", "fp16", "fp32"), max_batch: int = 8, sparse_share: float = SPARSE_SHARE,
             sparse_blocks=None):
    """A whole problem: lengths, flags, shapes, values, scale, layout, and with probability ``sparse_share``
    block-sparse lists (:func:`block_sparse` at ``sparse_blocks``; no window then). Shrinks toward simple. The block-sparse
    choice is drawn last, so a problem's other draws do not depend on it."""
    case = draw(_attention_problem(max_tokens, head_dims, dtypes, max_batch))
    if sparse_share > 0 and draw(st.integers(0, 99)) >= 100 - round(100 * sparse_share):  # 0: dense
        case = replace(case, sparse=draw(block_sparse(sparse_blocks or SPARSE_BLOCK_SIZES)), window=(-1, -1))
    return case


@st.composite
def _attention_problem(draw, max_tokens: int, head_dims, dtypes, max_batch: int):
    head_dim = draw(st.sampled_from(head_dims))
    dtype = draw(st.sampled_from(dtypes))
    blocks = tile_sizes(head_dim, DTYPES[dtype])
    budget = max_tokens if head_dim <= 64 else max_tokens // 2
    broadcast_q = draw(st.booleans())
    lengths_k = draw(sequence_lengths(blocks, max_batch=max_batch, max_tokens=budget))
    if broadcast_q:
        lq = draw(st.one_of(st.integers(0, max(1, budget // 4)), st.sampled_from(_boundary_lengths(blocks, budget))))
        lengths_q = (min(lq, max(1, budget // 2)),)
    else:
        lengths_q = _relate(draw, lengths_k, blocks, budget)
    scale = draw(st.one_of(st.none(), st.floats(-2.0, 2.0, allow_nan=False).filter(lambda x: abs(x) > 1e-3)))
    causal = draw(st.booleans())
    heads = draw(st.sampled_from([1, 2, 3, 4]))
    kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0][::-1]))
    # a sliding window around the tile sizes: one side, both, or none (shrinks to none)
    side = st.one_of(st.just(-1), st.sampled_from(sorted({0, 1} | set(blocks) | {b - 1 for b in blocks})),
                     st.integers(0, max(1, budget)))
    window = draw(st.one_of(st.just((-1, -1)), st.tuples(side, st.just(-1) if causal else side)))
    return Case(
        lengths_q=lengths_q,
        lengths_k=lengths_k,
        heads=heads,
        kv_heads=kv_heads,
        window=window,
        head_dim=head_dim,
        dtype=dtype,
        causal=causal,
        broadcast_q=broadcast_q,
        softmax_scale=scale,
        q_scale=draw(st.sampled_from([1.0, 1.0, 1.0, 20.0])),
        values=draw(st.sampled_from(VALUE_RECIPES)),
        strided=draw(st.booleans()),
        dout_layout=draw(st.sampled_from(DOUT_LAYOUTS)),
        offsets_dtype=draw(st.sampled_from(["int32", "int64"])),
        seed=draw(st.integers(0, 2 ** 16)),
    )


# block sizes of block-sparse draws, shrinking toward the TLX kernels' (128)
SPARSE_BLOCK_SIZES = (128, 64, 32, 16)


@st.composite
def block_sparse(draw, blocks=SPARSE_BLOCK_SIZES):
    """A block-sparse ``Case.sparse``: random lists from empty to every visible block, no list at all, one or
    a few blocks by top-k, or a ratio up to 1.0 (dense); shrinks toward random lists at block 128."""
    block_size = draw(st.sampled_from(blocks))
    rule = draw(st.sampled_from(("random", "topk", "ratio", "none")))
    value = {"random": st.sampled_from((0.5, 0.0, 1.0, 0.2, 0.8)), "topk": st.sampled_from((1, 2, 3, 1000)),
             "ratio": st.sampled_from((0.5, 1.0, 0.25, 0.75)), "none": st.just(0)}[rule]
    return (rule, draw(value), block_size)


PRODUCTION_SHARE = 0.85  # of the "production" mix: draws the TLX kernels take (the rest: everything else)
# the rest of the production mix: every head dim, the padded one (40, no power of two: the portable kernels
# mask the head dim, code no TLX draw reaches) three times as often
PORTABLE_HEAD_DIMS = (40, 32, 16, 40, 64, 40, 128, 256)
MIXES = ("all", "production")


@st.composite
def mixed_problems(draw, mix: str = "all", max_tokens: int = CPU_MAX_TOKENS):
    """Problems in a fuzzing mix: "all" draws :func:`problems` over every dtype and head dim; "production"
    draws PRODUCTION_SHARE of them from what the TLX kernels take (bf16/fp16, head dim 64/128: what users
    run on Hopper) and the rest from everything (PORTABLE_HEAD_DIMS). Shrinks toward the production side."""
    if mix not in MIXES:
        raise ValueError(f"mix: expected one of {MIXES}, got {mix!r}")
    if mix == "all":
        return draw(problems(max_tokens=max_tokens))
    if draw(st.integers(0, 99)) < round(100 * PRODUCTION_SHARE):
        return draw(problems(max_tokens=max_tokens, **TLX_ONLY))
    return draw(problems(max_tokens=max_tokens, head_dims=PORTABLE_HEAD_DIMS))
