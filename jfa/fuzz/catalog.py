"""Hand-picked adversarial cases: the one catalogue of the correctness suite (tests, gate, fuzz seeds,
GPU checks, the simulator).

Each family targets one way a jagged kernel goes wrong: empty sequences (leading, trailing, runs,
all, B = 0), length 1, lengths at every tile size -1/0/+1 (read from the kernels' configs, so the
suite follows the configs), Lq != Lk both ways with causal (fully masked rows), broadcast-Q, every
head dim and dtype, saturated softmax, strided views, int64 offsets, explicit scales. The TLX kernels
get their own tile edges (per consumer, per work item, per key block, per query step), many work items
per CTA (ring and phase wrap-around, the persistent stride) and the items between which a consumer has
no key or no row; ``sanitize_cases`` are the small shapes compute-sanitizer runs. Block-sparse attention
(``sparse_cases``) gets every way of making lists (random, none, one block, top-k, ratios up to dense)
over the same edges: empty sequences, sequences shorter than a block, block tails, Lq != Lk under causal,
grouped heads, broadcast Q, score ties.
"""
from __future__ import annotations

from jfa.fuzz.cases import DOUT_LAYOUTS, DTYPES, Case, replace
from jfa.kernels.triton.configs import tile_sizes

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
        # the gradient layouts training loops produce, on empty and non-empty sides
        replace(base, lengths_q=(0, 0), lengths_k=(5, 9), dout_layout="sum", name="empty-queries-sum-grad"),
        replace(base, lengths_q=(0,), lengths_k=(0, 7), broadcast_q=True, dout_layout="sum",
                name="bcastq-lq0-sum-grad"),
        replace(base, lengths_q=(0, 0, 0), lengths_k=(0, 0, 0), dout_layout="expanded", name="all-empty-expanded-grad"),
    ]
    cases += [
        replace(base, lengths_q=(33, 0, 70), lengths_k=(70, 5, 33), heads=4, kv_heads=2, causal=True, name="gqa-causal"),
        replace(base, lengths_q=(33, 70), lengths_k=(129, 33), heads=3, kv_heads=1, name="mqa"),
        replace(base, lengths_q=(70,), lengths_k=(3, 0, 130, 64), heads=4, kv_heads=2, broadcast_q=True,
                name="gqa-bcastq"),
        replace(base, lengths_q=(200, 64), lengths_k=(200, 100), window=(16, 16), name="window-both"),
        replace(base, lengths_q=(200, 64), lengths_k=(200, 100), causal=True, window=(33, 0), name="window-causal"),
        replace(base, lengths_q=(150, 90), lengths_k=(20, 200), window=(0, -1), name="window-left-only-masked-rows"),
        replace(base, lengths_q=(150, 90), lengths_k=(200, 20), window=(-1, 5), name="window-right-only"),
        replace(base, lengths_q=(130,), lengths_k=(1, 200, 0), heads=4, kv_heads=1, causal=True, window=(64, -1),
                broadcast_q=True, name="mqa-window-bcastq-causal"),
    ]
    for layout in DOUT_LAYOUTS[1:]:
        cases.append(replace(base, lengths_q=(33, 0, 70), lengths_k=(70, 5, 33), causal=True, dout_layout=layout,
                             name=f"dout-{layout}"))
    for block in tile_sizes(head_dim, DTYPES[dtype]):
        lens = tail_lengths(block)
        cases.append(replace(base, lengths_q=lens, lengths_k=lens, name=f"tails-{block}"))
        cases.append(replace(base, lengths_q=lens, lengths_k=lens[::-1], causal=True, name=f"tails-{block}-causal"))
    return [replace(c, name=f"{c.name}-{dtype}-D{head_dim}") for c in cases]


def head_dim_cases(dtype: str) -> list:
    """Every supported head dim (powers of two and an odd one), causal and cross-length."""
    return [Case((33, 70), (70, 33), head_dim=d, dtype=dtype, causal=True, heads=2, name=f"headdim-{d}-{dtype}")
            for d in HEAD_DIMS + (40,)]


def sparse_cases(block_size: int, dtype: str = "bf16", head_dim: int = 32, *, heads: int = 2,
                 prefix: str = "sparse") -> list:
    """Block-sparse attention at ``block_size``: each shape family under the list rules that reach its code
    paths (``jfa.fuzz.cases.SPARSE_RULES``; ratio 1.0 keeps every visible block, which is dense attention)."""
    bs = block_size
    base = Case((), (), heads=heads, head_dim=head_dim, dtype=dtype)
    tag = f"bs{bs}-{dtype}-D{head_dim}"
    families = [
        # empty and short sequences, block tails, a sequence with no key, one with no query
        ("mixed", dict(lengths_q=(3 * bs + 5, 0, bs - 1, 2 * bs), lengths_k=(2 * bs + 1, bs, 0, 4 * bs)),
         (("random", 0.5), ("none", 0), ("topk", 1), ("ratio", 1.0))),
        ("causal-lq-gt-lk", dict(lengths_q=(3 * bs + 7, 2 * bs), lengths_k=(bs + 3, 2 * bs), causal=True),
         (("random", 0.6), ("topk", 2), ("ratio", 0.5), ("ratio", 1.0))),
        ("causal-lq-lt-lk", dict(lengths_q=(bs + 1, 5), lengths_k=(4 * bs - 1, 3 * bs), causal=True),
         (("random", 0.4), ("topk", 1), ("ratio", 0.3))),
        ("gqa-causal", dict(lengths_q=(2 * bs + 3, bs), lengths_k=(2 * bs + 3, 3 * bs), heads=2 * heads,
                            kv_heads=heads // 2 or 1, causal=True),
         (("random", 0.5), ("ratio", 0.5))),
        ("bcastq-causal", dict(lengths_q=(2 * bs + 3,), lengths_k=(3 * bs, 5, 0, bs + 1), broadcast_q=True,
                               causal=True), (("random", 0.5), ("topk", 2))),
        ("bcastq", dict(lengths_q=(bs + 9,), lengths_k=(2 * bs + 1, bs), broadcast_q=True), (("ratio", 0.5),)),
        ("all-empty", dict(lengths_q=(0, 0), lengths_k=(0, bs)), (("random", 1.0),)),
        # equal keys: every score ties and the selection takes the lowest blocks
        ("score-ties", dict(lengths_q=(2 * bs,), lengths_k=(4 * bs,), values="constant-keys"),
         (("topk", 2), ("ratio", 0.5))),
    ]
    cases = []
    for family, shape, rules in families:
        for rule, value in rules:
            cases.append(replace(base, **shape, sparse=(rule, value, bs),
                                 name=f"{prefix}-{family}-{rule}{value:g}-{tag}"))
    return cases


def default_suite() -> list:
    """The full fixed suite: structure in bf16 and fp32 (and a slice in fp16), every head dim per dtype,
    block-sparse attention at small blocks in each dtype."""
    cases = structural_cases("bf16", 32) + structural_cases("fp32", 64)
    cases += [c for c in structural_cases("fp16", 128) if "tails" in c.name or "causal" in c.name]
    for dtype in DTYPES:
        cases += head_dim_cases(dtype)
    cases += sparse_cases(16, "bf16", 32) + sparse_cases(32, "fp32", 64) + sparse_cases(64, "fp16", 16)
    return cases


TLX_DTYPES = ("bf16", "fp16")
TLX_HEAD_DIMS = (64, 128)


def tlx_tile_sizes(head_dim: int) -> list:
    """Every row count a TLX kernel tiles by at ``head_dim``: the forward's rows per consumer and per work
    item and its key block, the backward's query steps (with and without the fused dQ), key rows per
    consumer and per work item."""
    from jfa.kernels.tlx.hopper import backward, forward

    fwd = forward.config_for(head_dim)
    sizes = {fwd.block_m, forward.NUM_CONSUMERS * fwd.block_m, fwd.block_n}
    for fused in (False, True):
        bwd = backward.config_for(head_dim, fused)
        sizes |= {bwd.block_m, bwd.block_n, backward.NUM_CONSUMERS * bwd.block_n}
    return sorted(sizes)


def _many_lengths(count: int, longest: int, seed: int) -> tuple:
    import torch

    g = torch.Generator().manual_seed(seed)
    return tuple(int(x) for x in torch.randint(0, longest, (count,), generator=g))


def tlx_cases(scale: str = "gpu") -> list:
    """The TLX kernels' catalogue: the structural cases for every supported dtype and head dim, the TLX
    tile edges, many work items per CTA (plain and broadcast Q), long sequences with more items than
    SMs, a keyless consumer between items, and the value recipes that stress the softmax.
    ``scale="sim"`` keeps every case small enough for the CPU simulator (a few CTAs there: many items
    per CTA come from fewer sequences)."""
    sim = scale == "sim"
    if scale not in ("gpu", "sim"):
        raise ValueError(f"scale: must be 'gpu' or 'sim', got {scale!r}")
    out = []
    for dtype in TLX_DTYPES:
        for head_dim in TLX_HEAD_DIMS:
            out += structural_cases(dtype, head_dim)
            base = Case((), (), head_dim=head_dim, dtype=dtype)
            for block in tlx_tile_sizes(head_dim):
                lens = tail_lengths(block)
                out.append(replace(base, lengths_q=lens, lengths_k=lens, name=f"tlx-tails-{block}-{dtype}-D{head_dim}"))
                out.append(replace(base, lengths_q=lens, lengths_k=lens[::-1], causal=True,
                                   name=f"tlx-tails-{block}-causal-{dtype}-D{head_dim}"))
            lens = _many_lengths(12 if sim else 200, 200 if sim else 400, head_dim)
            heads = 2 if sim else 4
            for causal in (False, True):
                flag = "-causal" if causal else ""
                out.append(replace(base, lengths_q=lens, lengths_k=lens, heads=heads, causal=causal,
                                   name=f"tlx-many-items{flag}-{dtype}-D{head_dim}"))
                out.append(replace(base, lengths_q=(130 if sim else 256,), lengths_k=lens, heads=heads, causal=causal,
                                   broadcast_q=True, name=f"tlx-many-items-bcastq{flag}-{dtype}-D{head_dim}"))
    for causal in (False, True):
        for head_dim in TLX_HEAD_DIMS:
            lens = (300, 257) * 2 if sim else (600, 513) * 20
            out.append(Case(lens, lens, heads=2 if sim else 4, head_dim=head_dim, dtype="bf16", causal=causal,
                            name=f"tlx-long-items{'-causal' if causal else ''}-D{head_dim}"))
    # causal sequences long and uneven enough for the forward's counter schedule (``Variant.for_launch``), Lq != Lk
    # both ways (the first rows of the first sequence see no key)
    for head_dim in TLX_HEAD_DIMS:
        out.append(Case((1500, 300), (1400, 450), heads=2, head_dim=head_dim, dtype="bf16", causal=True,
                        name=f"tlx-long-causal-counter-D{head_dim}"))
    # sliding windows wide enough for unmasked work between the band's edges (the forward's K/V blocks a half
    # sees whole, visited first; the backward's query steps that see every key of an item), Lq != Lk both
    # ways, rows that see no key, each side of the band unbounded in turn
    for head_dim in TLX_HEAD_DIMS:
        tag = f"bf16-D{head_dim}"
        out += [Case((520, 130, 3), (600, 70, 300), heads=4, kv_heads=2, head_dim=head_dim, dtype="bf16",
                     causal=True, window=(400, 0), name=f"tlx-wide-window-causal-gqa-{tag}"),
                Case((450, 200), (400, 330), heads=2, head_dim=head_dim, dtype="bf16", window=(300, 200),
                     name=f"tlx-wide-window-both-{tag}"),
                Case((400, 129), (300, 500), heads=2, head_dim=head_dim, dtype="bf16", window=(-1, 256),
                     name=f"tlx-wide-window-right-{tag}"),
                Case((300, 260), (420, 257), heads=2, head_dim=head_dim, dtype="bf16", window=(256, -1),
                     name=f"tlx-wide-window-left-{tag}")]
    # a consumer without keys (the second key tile's upper half: 2 keys) between items whose steps reduce-add
    # dQ: with 132 CTAs each runs three items, one of them keyless with an odd step count
    out.append(Case((130, 130), (130, 130), heads=6 if sim else 132, head_dim=128, dtype="bf16", causal=True,
                    name="tlx-keyless-between-items-causal-D128"))
    for values in ("near-ties", "dominant-key", "constant-keys", "rising-keys"):
        out.append(Case((300, 77, 513), (300, 513, 77), heads=2, head_dim=128, dtype="bf16", causal=True,
                        values=values, name=f"tlx-values-{values}"))
    # block-sparse: the TLX build's block is one work item's rows (128)
    for dtype in TLX_DTYPES:
        for head_dim in TLX_HEAD_DIMS:
            out += sparse_cases(128, dtype, head_dim, prefix="tlx-sparse")
    return out


def blackwell_cases() -> list:
    """The TLX Blackwell forward's catalogue, at the simulator's scale (its work items are 256 rows, its key
    blocks 128): empty query and key sequences, 1-token ones, row and key tails, several key blocks per
    item, Lq != Lk both ways under causal (rows and whole items that see no key), broadcast Q, grouped
    key/value heads, strided views, a negative scale; head dims 64 and 128, bf16 and fp16."""
    def case(name, lengths_q, lengths_k, **kw):
        return Case(tuple(lengths_q), tuple(lengths_k), name=name, **kw)

    many = _many_lengths(10, 300, 7)

    return [
        # an empty query sequence, a 1-token one, one whose keys are empty (its rows see none), tails of 130 and 5
        case("bw-empty-and-one-token-D64-bf16", (0, 1, 130, 5), (3, 1, 130, 0), head_dim=64),
        case("bw-empty-and-one-token-D128-fp16", (0, 1, 130, 5), (3, 1, 130, 0), head_dim=128, dtype="fp16"),
        # Lq > Lk, causal: the first Lq - Lk rows of a sequence see no key (out 0, lse -inf), whole items too
        case("bw-causal-lq-gt-lk-D128-bf16", (300, 7), (44, 0), head_dim=128, causal=True),
        case("bw-causal-lq-gt-lk-D64-fp16", (300, 7, 2), (100, 3, 0), head_dim=64, dtype="fp16", causal=True),
        # Lq < Lk, causal: the diagonal and the bulk of fully seen blocks, several key blocks per item
        case("bw-causal-lq-lt-lk-D64-bf16", (77, 130, 1), (300, 260, 129), head_dim=64, causal=True),
        case("bw-causal-lq-lt-lk-D128-fp16", (77, 130), (300, 260), head_dim=128, dtype="fp16", causal=True),
        # four key blocks with a partial last one, two work items of a sequence, a row tail of 1
        case("bw-multi-block-tails-D128-bf16", (257, 1), (385, 129), head_dim=128),
        case("bw-multi-block-tails-D64-fp16", (257, 1), (385, 129), head_dim=64, dtype="fp16"),
        # one dense Q of 129 rows shared by every key sequence (an empty one and a 1-token one among them)
        case("bw-bcastq-causal-D64-bf16", (129,), (260, 0, 1, 130), head_dim=64, causal=True, broadcast_q=True),
        case("bw-bcastq-D128-fp16", (129,), (260, 0, 1, 130), head_dim=128, dtype="fp16", broadcast_q=True),
        # query head h reads key/value head h // 2
        case("bw-gqa-causal-D64-bf16", (200, 33), (150, 300), heads=4, kv_heads=2, head_dim=64, causal=True),
        # q, k, v slices of one fused [T, 3H, D] projection (token stride 3 H D)
        case("bw-strided-fused-qkv-D128-bf16", (140, 3), (140, 3), head_dim=128, strided=True),
        # a negative scale: the bulk's row maximum is min(S) * scale
        case("bw-scale-neg0.7-D64-bf16", (200, 60), (260, 60), head_dim=64, softmax_scale=-0.7),
        # many work items per CTA: every ring and phase wraps around many times, items without keys between
        case("bw-many-items-causal-D128-bf16", many, many[::-1], head_dim=128, causal=True),
        case("bw-many-items-bcastq-D64-fp16", (130,), many, head_dim=64, dtype="fp16", broadcast_q=True),
    ]


def sanitize_cases() -> list:
    """Small adversarial shapes for compute-sanitizer (memcheck, racecheck): empty sequences, length 1,
    tile tails on both sides, Lq != Lk under causal (rows that see no key), broadcast Q, grouped heads
    under sliding windows (tiles the band skips), block-sparse lists."""
    out = []
    for head_dim in TLX_HEAD_DIMS:
        base = dict(heads=2, head_dim=head_dim, dtype="bf16")
        out += [Case((0, 1, 0, 127, 129, 0), (0, 1, 5, 127, 129, 0), name=f"san-empty-one-tails-D{head_dim}", **base),
                Case((1, 300, 64, 200), (130, 7, 64, 1), causal=True, name=f"san-causal-cross-D{head_dim}", **base),
                Case((200, 7, 0), (7, 200, 3), causal=True, name=f"san-causal-lq-gt-lk-D{head_dim}", **base),
                Case((77,), (0, 129, 1), broadcast_q=True, name=f"san-bcastq-D{head_dim}", **base),
                Case((130, 7, 200), (200, 64, 129), heads=4, kv_heads=2, head_dim=head_dim, dtype="bf16", causal=True,
                     window=(64, 0), name=f"san-gqa-window-causal-D{head_dim}"),
                Case((150, 0, 90), (20, 3, 200), heads=2, kv_heads=1, head_dim=head_dim, dtype="bf16",
                     window=(16, 40), name=f"san-mqa-window-D{head_dim}"),
                # block-sparse: listed blocks out of order of length, tails, a causal diagonal, a broadcast Q
                Case((300, 0, 129), (260, 90, 400), causal=True, sparse=("random", 0.6, 128),
                     name=f"san-sparse-causal-D{head_dim}", **base),
                Case((77,), (0, 300, 129), broadcast_q=True, sparse=("topk", 2, 128),
                     name=f"san-sparse-bcastq-D{head_dim}", **base)]
    return out
