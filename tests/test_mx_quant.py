"""The MXFP8 quantizer (docs/mxfp8.md, "Quantizer"): the NumPy reference (jfa.oracle.mx) against torch's
float8_e4m3fn and against its own definitions, and the device quantizer (jfa.mx.quantize: Triton kernels,
the interpreter on CPU) bit-exact against the reference. One property per test; device outputs are
poisoned (bytes the kernel never wrote would show). Inputs are batched into few launches: interpreted
Triton is slow per program."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import jfa.mx as jmx
from jfa.kernels import alloc
from jfa.oracle import mx as ref

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RULES = ("floor", "rceil")
BITS_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}

ALL_BYTES = np.arange(256)
E4M3 = ref.decode_e4m3(ALL_BYTES)
FINITE_BYTES = ALL_BYTES[(ALL_BYTES & 0x7F) != 0x7F]  # 254 bytes: every finite E4M3 value, +-0 included
POSITIVE = E4M3[:127]  # bytes 0x00 .. 0x7E in increasing order
# scale exponents at the edges of what each dtype carries together with all 254 E4M3 values times 2^s
SCALE_EDGES = {"fp32": (-127, -126, -9, 0, 1, 118, 119), "bf16": (-124, -123, 0, 119), "fp16": (-15, -14, 0, 7)}


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------
def _assert_bytes_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    first = [tuple(i) for i in bad[:4]]
    assert bad.size == 0, (f"{what}: {len(bad)} bytes differ; first at {first}: got {[hex(got[i]) for i in first]}, "
                           f"want {[hex(want[i]) for i in first]}")


def _exact(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float64) as a CPU ``dtype`` tensor; every value must be representable."""
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(dtype)
    back = t.double().numpy()
    assert np.array_equal(back, values, equal_nan=True), "test bug: a value is not representable in the dtype"
    return t


def _check(x: torch.Tensor, axis: str, rule: str, cu=None) -> jmx.MXTensor:
    """Quantize on the device and assert the bytes equal the reference's; returns the MXTensor."""
    with alloc.poisoned_outputs():
        mx = jmx.quantize(x, axis, cu, rule)
    cu_np = None if cu is None else cu.cpu().numpy()
    want_e, want_s = ref.quantize_mx(x.double().cpu().numpy(), axis, cu_np, rule)
    _assert_bytes_equal(mx.data.view(torch.uint8).cpu().numpy(), want_e, "element bytes")
    got_s = mx.scales.cpu().numpy()
    if axis == "tokens":
        nb = want_s.shape[0]
        assert got_s.shape[0] == jmx.token_scale_rows(x.shape[0], cu.numel() - 1)
        assert (got_s[nb:] == 0xFF).all(), "scale rows past the real block count must hold 0xFF"
        got_s = got_s[:nb]
    _assert_bytes_equal(got_s, want_s, "scale bytes")
    return mx


def _pinned_blocks(values: np.ndarray, s: int) -> np.ndarray:
    """``values`` (already times 2^s) in 32-element blocks whose first element 448 * 2^s pins the scale
    exponent to s under both rules; ``[blocks, 32]``, zero-filled."""
    per = 31
    n = -(-len(values) // per)
    blocks = np.zeros((n, 32))
    blocks[:, 0] = np.ldexp(448.0, s)
    blocks[:, 1:].flat[: len(values)] = values
    return blocks


def _neighbours(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The next value below and above each finite positive ``values`` entry in ``dtype`` (one ulp)."""
    t = _exact(values, dtype)
    bits = t.view(BITS_VIEW[dtype])
    out = torch.cat([(bits - 1).view(dtype), (bits + 1).view(dtype)]).double().numpy()
    return out[np.isfinite(out) & (out > 0)]


def _representable(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    back = torch.from_numpy(values).to(dtype).double().numpy()
    return values[back == values]


def _heavy(rng: np.random.Generator, shape, spread: float = 6.0) -> np.ndarray:
    """Normal values times a log-normal magnitude: many binades inside every block."""
    return rng.standard_normal(shape) * np.exp2(np.round(rng.standard_normal(shape) * spread))


# ----------------------------------------------------------------------------------------------------
# the reference: E4M3 against torch's float8_e4m3fn, and against its definition
# ----------------------------------------------------------------------------------------------------
def test_decode_of_all_256_bytes_matches_torch():
    want = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double().numpy()
    got = ref.decode_e4m3(ALL_BYTES)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 is 0x80
    assert np.isnan(got).sum() == 2 and np.isnan(got[[0x7F, 0xFF]]).all()
    assert got[0x7E] == 448 and got[0x01] == 2.0 ** -9 and got[0x08] == 2.0 ** -6 and got[0x07] == 7 * 2.0 ** -9


def test_encode_inverts_decode_on_every_finite_byte():
    _assert_bytes_equal(ref.encode_e4m3(E4M3[FINITE_BYTES]), FINITE_BYTES.astype(np.uint8), "bytes")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_encode_matches_torch_cast_where_both_round_to_nearest_even(dtype):
    """|x| <= 464 (448 and its midpoint to 480): torch's cast is plain RNE there in every version; above,
    torch releases differ (this one saturates, older ones give NaN), so saturation is tested apart."""
    rng = np.random.default_rng(1)
    mids = (POSITIVE[:-1] + POSITIVE[1:]) / 2
    scaled = np.concatenate([POSITIVE, mids, [464.0]])
    randoms = np.exp2(rng.uniform(-16, np.log2(464), 4000))
    values = np.concatenate([_representable(np.concatenate([scaled, randoms]), dtype),
                             _neighbours(_representable(scaled, dtype), dtype)])
    values = values[values <= 464]
    values = np.concatenate([values, -values, [0.0, -0.0]])
    if dtype != torch.float16:  # fp32 / bf16 subnormals
        values = np.concatenate([values, _representable(np.array([2.0 ** -149, 2.0 ** -130, -(2.0 ** -127)]), dtype)])
    x = _exact(values, dtype)
    want = x.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    _assert_bytes_equal(ref.encode_e4m3(x.double().numpy()), want, "bytes")


def test_encode_of_nan_is_nan_with_its_sign():
    got = ref.encode_e4m3(np.array([np.nan, -np.nan]))
    assert got.tolist() == [0x7F, 0xFF]


def test_encode_saturates_everything_past_448_infinity_included():
    big = np.array([448.0, 448.0000001, 463.99, 464.0, 464.0001, 479.9, 480.0, 1e6, 1e300, np.inf])
    assert ref.encode_e4m3(big).tolist() == [0x7E] * len(big)
    assert ref.encode_e4m3(-big).tolist() == [0xFE] * len(big)


def test_encode_ties_go_to_the_even_byte_normal_and_subnormal():
    lo, hi = ALL_BYTES[:126], ALL_BYTES[1:127]  # adjacent positive codes; their values' midpoints
    mids = (E4M3[lo] + E4M3[hi]) / 2
    even = np.where(lo % 2 == 0, lo, hi).astype(np.uint8)
    _assert_bytes_equal(ref.encode_e4m3(mids), even, "ties")
    _assert_bytes_equal(ref.encode_e4m3(-mids), even | 0x80, "negative ties")
    # just off the midpoint rounds to the nearer neighbour
    _assert_bytes_equal(ref.encode_e4m3(np.nextafter(mids, 0)), lo.astype(np.uint8), "below ties")
    _assert_bytes_equal(ref.encode_e4m3(np.nextafter(mids, np.inf)), hi.astype(np.uint8), "above ties")
    assert ref.encode_e4m3(np.array([2.0 ** -10, 2.0 ** -10 * 3, 2.0 ** -11])).tolist() == [0x00, 0x02, 0x00]


def test_encode_keeps_the_sign_of_zero_and_of_underflow():
    assert ref.encode_e4m3(np.array([0.0, -0.0, -(2.0 ** -11), 2.0 ** -11])).tolist() == [0x00, 0x80, 0x80, 0x00]


# ----------------------------------------------------------------------------------------------------
# the reference: scale exponents
# ----------------------------------------------------------------------------------------------------
def _amax_samples() -> np.ndarray:
    rng = np.random.default_rng(2)
    k = np.arange(-135, 136)
    edges = np.concatenate([np.exp2(k), 448 * np.exp2(k), 464 * np.exp2(k), 1.9999 * np.exp2(k)])
    return np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf),
                           np.exp2(rng.uniform(-130, 130, 2000))])


def test_floor_exponent_is_floor_log2_amax_minus_8():
    amax = _amax_samples()
    s = ref.scale_exponent(amax, "floor")
    inside = (s > -127) & (s < 127)
    assert np.all(np.ldexp(1.0, s[inside] + 8) <= amax[inside])
    assert np.all(amax[inside] < np.ldexp(1.0, s[inside] + 9))
    assert np.all(amax[s == -127] < 2.0 ** -118) and np.all(amax[s == 127] >= 2.0 ** 135)


def test_rceil_exponent_is_the_smallest_that_fits_amax_under_448():
    amax = _amax_samples()
    s = ref.scale_exponent(amax, "rceil")
    inside = (s > -127) & (s < 127)
    assert np.all(amax[inside] <= np.ldexp(448.0, s[inside]))
    assert np.all(np.ldexp(448.0, s[inside] - 1) < amax[inside])
    assert np.all(amax[s == -127] <= np.ldexp(448.0, -127))


def test_rceil_is_floor_or_floor_plus_one():
    amax = _amax_samples()
    d = ref.scale_exponent(amax, "rceil") - ref.scale_exponent(amax, "floor")
    assert set(np.unique(d)) <= {0, 1}


@pytest.mark.parametrize("amax, floor_byte, rceil_byte", [
    (0.0, 0x00, 0x00),                      # an all-zero block: the smallest scale
    (2.0 ** -149, 0x00, 0x00),              # clamped at 2^-127
    (448.0, 127, 127),                      # 448 * 2^0: both rules give 2^0
    (449.0, 127, 128),                      # FLOOR keeps 2^0 (449 saturates), RCEIL moves up
    (464.0, 127, 128),
    (511.99, 127, 128),
    (512.0, 128, 128),
    (1.0, 119, 119),                        # 1 <= 448 * 2^-8 = 1.75
    (1.75, 119, 119),
    (1.7500001, 119, 120),
    (float(np.float32(3.4028235e38)), 246, 247),  # fp32 max: the largest bytes an fp32 input reaches
    (np.nan, 0xFF, 0xFF),
    (np.inf, 0xFF, 0xFF),
], ids=lambda v: repr(v))
def test_scale_bytes_of_documented_amax(amax, floor_byte, rceil_byte):
    assert int(ref.scale_bits(amax, "floor")) == floor_byte
    assert int(ref.scale_bits(amax, "rceil")) == rceil_byte


def test_tokens_blocks_never_straddle_sequences_in_the_reference():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 2, 3)), 1e6 * rng.standard_normal((7, 2, 3))
    joint = ref.quantize_mx(np.concatenate([a, b]), "tokens", [0, 40, 47])
    ea, sa = ref.quantize_mx(a, "tokens", [0, 40])
    eb, sb = ref.quantize_mx(b, "tokens", [0, 7])
    assert np.array_equal(joint[0], np.concatenate([ea, eb])) and np.array_equal(joint[1], np.concatenate([sa, sb]))


@pytest.mark.parametrize("axis", ["dim", "tokens"])
def test_a_short_tail_block_is_a_zero_filled_one_in_the_reference(axis):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 2, 40)) if axis == "dim" else rng.standard_normal((40, 2, 3))
    if axis == "dim":
        padded = np.concatenate([x, np.zeros((40, 2, 24))], axis=-1)
        e, s = ref.quantize_mx(x, "dim")
        pe, ps = ref.quantize_mx(padded, "dim")
        assert np.array_equal(e, pe[..., :40]) and np.array_equal(s, ps)
    else:
        padded = np.concatenate([x, np.zeros((24, 2, 3))])
        e, s = ref.quantize_mx(x, "tokens", [0, 40])
        pe, ps = ref.quantize_mx(padded, "tokens", [0, 64])
        assert np.array_equal(e, pe[:40]) and np.array_equal(s, ps)


# ----------------------------------------------------------------------------------------------------
# the device quantizer against the reference
# ----------------------------------------------------------------------------------------------------
CASES = [(d, r) for d in DTYPES for r in RULES]
CASE_IDS = [f"{d}-{r}" for d, r in CASES]


@pytest.mark.parametrize("dtype, rule", CASES, ids=CASE_IDS)
def test_every_e4m3_value_under_the_edge_scales_round_trips(dtype, rule, device):
    """All 254 finite E4M3 values times 2^s, in blocks pinned to scale 2^s (amax 448 * 2^s), for the
    smallest and largest s the dtype carries: every element byte is the value's own byte."""
    blocks, want_e, want_s = [], [], []
    for s in SCALE_EDGES[dtype]:
        b = _pinned_blocks(np.ldexp(E4M3[FINITE_BYTES], s), s)
        blocks.append(b)
        codes = np.zeros(b.shape, dtype=np.uint8)
        codes[:, 0] = 0x7E
        codes[:, 1:].flat[: len(FINITE_BYTES)] = FINITE_BYTES
        want_e.append(codes)
        want_s.append(np.full(len(b), s + 127, dtype=np.uint8))
    x = _exact(np.concatenate(blocks), DTYPES[dtype]).reshape(-1, 1, 32).to(device)
    mx = _check(x, "dim", rule)
    _assert_bytes_equal(mx.data.view(torch.uint8).cpu().numpy().reshape(-1, 32), np.concatenate(want_e), "elements")
    _assert_bytes_equal(mx.scales.cpu().numpy().reshape(-1), np.concatenate(want_s), "scales")


@pytest.mark.parametrize("dtype, rule", CASES, ids=CASE_IDS)
def test_midpoints_round_to_even_normal_and_subnormal(dtype, rule, device):
    """Midpoints of adjacent E4M3 values (subnormal ones included, and 464 between 448 and 480), and
    their one-ulp neighbours in the dtype, times 2^s under pinned scales at the dtype's edges."""
    torch_dtype = DTYPES[dtype]
    mids = np.concatenate([(POSITIVE[:-1] + POSITIVE[1:]) / 2, [464.0]])
    blocks = []
    for s in SCALE_EDGES[dtype]:
        v = _representable(np.ldexp(mids, s), torch_dtype)
        v = np.concatenate([v, _neighbours(v, torch_dtype)])
        v = v[v <= np.ldexp(448.0, s)]  # keep the pin the block's amax
        blocks.append(_pinned_blocks(np.concatenate([v, -v]), s))
    x = _exact(np.concatenate(blocks), torch_dtype).reshape(-1, 1, 32).to(device)
    _check(x, "dim", rule)


@pytest.mark.parametrize("dtype, rule", CASES, ids=CASE_IDS)
def test_block_maxima_at_scale_boundaries(dtype, rule, device):
    """Blocks whose amax is 2^k, 448 * 2^k (the RCEIL boundary), 464 * 2^k (where FLOOR starts to
    saturate), the largest mantissa, one ulp either side of each, and the dtype's extremes; the other 31
    elements are random below amax."""
    torch_dtype = DTYPES[dtype]
    info = torch.finfo(torch_dtype)
    lo, hi = int(np.log2(info.smallest_normal)) - 3, int(np.log2(info.max)) - 1
    k = np.arange(lo, hi + 1)
    edges = _representable(np.concatenate([np.exp2(k), 448 * np.exp2(k - 8), 464 * np.exp2(k - 8),
                                           (2 - 2.0 ** -7) * np.exp2(k)]), torch_dtype)
    tiny = float(torch.tensor(0.0, dtype=torch_dtype).view(BITS_VIEW[torch_dtype]).add(1).view(torch_dtype))
    amax = np.concatenate([edges, _neighbours(edges, torch_dtype), [info.max, tiny, info.smallest_normal]])
    rng = np.random.default_rng(5)
    others = amax[:, None] * rng.uniform(-1, 1, (len(amax), 31)) * np.exp2(-rng.integers(0, 12, (len(amax), 31)))
    x = torch.from_numpy(np.concatenate([amax[:, None], others], axis=1)).to(torch_dtype)
    assert np.array_equal(x[:, 0].double().numpy(), amax)
    _check(x.reshape(-1, 1, 32).to(device), "dim", rule)


def test_floor_saturates_and_rceil_does_not(device):
    x = torch.tensor([500.0, 250.0, 1.0] + [0.0] * 29).reshape(1, 1, 32).to(device)
    floor = _check(x, "dim", "floor")
    rceil = _check(x, "dim", "rceil")
    assert int(floor.scales[0, 0, 0]) == 127 and int(floor.data.view(torch.uint8)[0, 0, 0]) == 0x7E  # 500 -> 448
    assert int(rceil.scales[0, 0, 0]) == 128 and float(rceil.dequantize()[0, 0, 0]) == 512.0  # 250 -> 256, times 2


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_zero_blocks_get_scale_byte_0_and_signed_zero_elements(dtype, device):
    x = torch.zeros(3, 2, 64, dtype=dtype)
    x[1, 0, 32:] = -0.0
    x[2, 1, :32] = 1.0  # one non-zero block beside the zero ones
    for axis, cu in (("dim", None), ("tokens", torch.tensor([0, 1, 3], dtype=torch.int32))):
        for rule in RULES:
            mx = _check(x.to(device), axis, rule, None if cu is None else cu.to(device))
            if axis == "dim":
                scales = mx.scales.cpu()
                assert (scales[0] == 0).all() and scales[1, 0].tolist() == [0, 0] and scales[2, 1, 0] == 119
                assert mx.data.view(torch.uint8).cpu()[1, 0, 32:].eq(0x80).all()


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("axis", ["dim", "tokens"])
def test_nan_and_inf_blocks_get_scale_0xff_and_dequantize_to_nan(dtype, axis, device):
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((40, 2, 64))).to(dtype)
    x[3, 0, 5] = float("nan")
    x[7, 1, 40] = float("inf")
    x[35, 0, 33] = float("-inf")
    cu = torch.tensor([0, 33, 40], dtype=torch.int64) if axis == "tokens" else None
    for rule in RULES:
        mx = _check(x.to(device), axis, rule, None if cu is None else cu.to(device))
        nan_blocks = np.zeros((40, 2, 64), dtype=bool)
        if axis == "dim":
            nan_blocks[3, 0, :32] = nan_blocks[7, 1, 32:] = nan_blocks[35, 0, 32:] = True
            assert int((mx.scales == 0xFF).sum()) == 3
        else:  # the blocks are rows 0-31 and 32 (sequence 0), 33-39 (sequence 1), one per (h, d)
            nan_blocks[:32, 0, 5] = nan_blocks[:32, 1, 40] = nan_blocks[33:, 0, 33] = True
            assert int((mx.scales[:3] == 0xFF).sum()) == 3
        data = mx.data.view(torch.uint8).cpu().numpy()
        assert (data[nan_blocks] == 0x7F).all()
        deq = mx.dequantize(torch.float32).cpu().numpy()
        assert np.array_equal(np.isnan(deq), nan_blocks)


LAYOUTS = {
    "one-full-block": [32],
    "short-tail": [40],
    "shorter-than-a-block": [5],
    "boundaries-31-33-64-1": [31, 33, 64, 1],
    "empty-leading-middle-trailing": [0, 5, 0, 70, 0],
    "one-empty-sequence": [0],
    "all-empty": [0, 0, 0],
    "no-sequences": [],
}


@pytest.mark.parametrize("lengths", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("dtype, rule", [("bf16", "floor"), ("fp32", "rceil"), ("fp16", "floor")],
                         ids=["bf16-floor", "fp32-rceil", "fp16-floor"])
def test_token_blocks_per_sequence(lengths, dtype, rule, device):
    rng = np.random.default_rng(7)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), dtype=torch.int32)
    T = int(cu[-1])
    x = _heavy(rng, (T, 2, 5))
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        x[start:end] *= 4.0 ** (3 * b - 6)  # sequences of very different magnitude: a straddling block shows
    mx = _check(torch.from_numpy(x).to(DTYPES[dtype]).to(device), "tokens", rule, cu.to(device))
    assert np.array_equal(mx.block_offsets.cpu().numpy(), ref.token_block_offsets(cu.numpy()))
    assert mx.num_blocks() == int(ref.token_block_offsets(cu.numpy())[-1])


def test_token_blocks_do_not_straddle_on_the_device(device):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((40, 2, 3)), 1e6 * rng.standard_normal((7, 2, 3))
    joint = jmx.quantize(torch.from_numpy(np.concatenate([a, b])).float().to(device), "tokens",
                         torch.tensor([0, 40, 47], device=device))
    alone = jmx.quantize(torch.from_numpy(a).float().to(device), "tokens", torch.tensor([0, 40], device=device))
    assert torch.equal(joint.scales[:2], alone.scales[:2])
    assert torch.equal(joint.data.view(torch.uint8)[:40], alone.data.view(torch.uint8))


HEAD_DIMS = [1, 16, 32, 40, 64, 100, 128]


@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_dim_blocks_any_head_dim(head_dim, device):
    """D % 32 != 0 zero-fills the tail block; each dtype and rule on one launch each."""
    rng = np.random.default_rng(head_dim)
    x = _heavy(rng, (6, 2, head_dim))
    for dtype in DTYPES.values():
        for rule in RULES:
            _check(torch.from_numpy(x).to(dtype).to(device), "dim", rule)


@pytest.mark.parametrize("head_dim", [1, 2, 3], ids=["D1", "D2", "D3"])
def test_one_token_one_head_tiny_head_dim(head_dim, device):
    """The shape a D-axis tiling once got wrong on the H200 (head dim 2: the second byte's magnitude lost,
    0x80 where 0xd0 is right), one token and one head, with the values of that failure."""
    values = np.array([8.0625, -0.263671875, 3.0])[:head_dim].reshape(1, 1, head_dim)
    for rule in RULES:
        _check(torch.tensor(values, dtype=torch.bfloat16, device=device), "dim", rule)


@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 65536, 2), (300, 70000, 128), (5, 2 ** 24, 1)])
def test_dim_launch_of_more_than_65535_heads_keeps_cuda_axes_1_and_2_within_65535(tokens, heads, head_dim):
    """CUDA caps grid axes 1 and 2 at 65535: the D-axis launch puts its (token block, head) programs on axis 0,
    at least one per head."""
    from jfa.kernels.triton import mx_quant

    grid = mx_quant.dim_launch(tokens, heads, head_dim).grid
    assert all(n <= 65535 for n in grid[1:]), grid
    assert heads <= grid[0] <= 2 ** 31 - 1, grid


def test_dim_launch_past_2_31_programs_raises_naming_x():
    from jfa.kernels.triton import mx_quant

    with pytest.raises(ValueError, match="x: shape"):
        mx_quant.dim_launch(2 ** 40, 2, 128)


@pytest.mark.parametrize("rows, heads, head_dim", [(1, 65536, 128), (3, 2 ** 17, 128), (40, 70000, 256), (1, 1, 1)])
def test_tokens_launches_of_more_than_65535_column_blocks_keep_cuda_axis_1_within_65535(rows, heads, head_dim):
    """CUDA caps grid axes 1 and 2 at 65535: the token-axis launches take every scale row on axis 0 and split the
    column blocks into launches of at most 65535, each block in exactly one launch."""
    from jfa.kernels.triton import mx_quant

    cols, launches = mx_quant.tokens_launches(rows, heads, head_dim)
    assert all(grid[0] == rows and all(1 <= n <= 65535 for n in grid[1:]) for grid, _ in launches), launches
    covered = [first + c for (_, blocks), first in launches for c in range(blocks)]
    assert covered == list(range(-(-heads * head_dim // cols))), launches


def test_tokens_launches_past_2_31_rows_raise_naming_x():
    from jfa.kernels.triton import mx_quant

    with pytest.raises(ValueError, match="x: "):
        mx_quant.tokens_launches(2 ** 31, 2, 128)


@pytest.mark.parametrize("axis", ["dim", "tokens"])
def test_grid_past_2_31_programs_raises_before_allocating(axis, monkeypatch):
    """The grid check runs before the outputs exist: a stride-0 view stands in for the huge tensor."""
    from jfa.kernels.triton import mx_quant

    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated before the grid check")

    monkeypatch.setattr(mx_quant, "_bytes", no_allocation)
    monkeypatch.setattr(torch, "full", no_allocation)
    with pytest.raises(ValueError, match="x: "):
        if axis == "dim":
            mx_quant.quantize_dim(torch.zeros(1, 1, 1).expand(2 ** 40, 2, 128), False)
        else:
            cu = torch.tensor([0, 1])
            mx_quant.quantize_tokens(torch.zeros(1, 2, 128), cu, cu, 2 ** 31, False)


@pytest.mark.parametrize("grid_y", [65535, 2], ids=["one-launch", "launches-split-the-column-blocks"])
def test_tokens_rows_times_column_blocks_match_the_reference(grid_y, device, monkeypatch):
    """Several scale rows (two sequences, a short tail block) times several 128-column blocks (3 x 100 columns,
    the last block partial), in one launch or, with grid axis 1 capped below the block count (as past CUDA's
    65535), in several."""
    from jfa.kernels.triton import mx_quant

    monkeypatch.setattr(mx_quant, "MAX_GRID_Y", grid_y)
    rng = np.random.default_rng(11)
    x = _heavy(rng, (70, 3, 100))
    x[45, 2, 99] = np.nan
    cu = torch.tensor([0, 40, 70], device=device)
    for dtype in DTYPES.values():
        for rule in RULES:
            _check(torch.from_numpy(x).to(dtype).to(device), "tokens", rule, cu)


@pytest.mark.parametrize("axis", ["dim", "tokens"])
def test_strided_inputs(axis, device):
    """A slice of a fused [T, 3, H, D] projection, and a view whose head dim is not contiguous."""
    rng = np.random.default_rng(9)
    fused = torch.from_numpy(_heavy(rng, (37, 3, 2, 48))).to(torch.bfloat16).to(device)
    transposed = torch.from_numpy(_heavy(rng, (37, 48, 2))).float().to(device).transpose(1, 2)
    cu = torch.tensor([0, 30, 37], device=device) if axis == "tokens" else None
    for x in (fused[:, 1], transposed):
        assert not x.is_contiguous()
        _check(x, axis, "rceil", cu)


@pytest.mark.parametrize("shape", [(0, 2, 64), (4, 0, 64), (4, 2, 0)], ids=["T0", "H0", "D0"])
@pytest.mark.parametrize("axis", ["dim", "tokens"])
def test_empty_tensors(shape, axis, device):
    cu = torch.tensor([0, shape[0]], device=device) if axis == "tokens" else None
    mx = _check(torch.zeros(shape, device=device), axis, "floor", cu)
    assert mx.shape == torch.Size(shape) and mx.dequantize().shape == torch.Size(shape)


@given(lengths=st.lists(st.integers(0, 70), max_size=4), heads=st.integers(1, 2), head_dim=st.integers(1, 40),
       dtype=st.sampled_from(sorted(DTYPES)), rule=st.sampled_from(RULES), axis=st.sampled_from(["dim", "tokens"]),
       seed=st.integers(0, 2 ** 16))
@settings(max_examples=12)
def test_random_layouts_match_the_reference(lengths, heads, head_dim, dtype, rule, axis, seed, device):
    x = _heavy(np.random.default_rng(seed), (sum(lengths), heads, head_dim), spread=10.0)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])).to(device)
    cu = cu if axis == "tokens" else None
    _check(torch.from_numpy(x).to(DTYPES[dtype]).to(device), axis, rule, cu)


@given(lengths=st.lists(st.integers(0, 300), max_size=5), heads=st.integers(1, 5),
       head_dim=st.one_of(st.integers(1, 72), st.sampled_from([96, 128, 130, 160, 192, 255, 256])),
       dtype=st.sampled_from(sorted(DTYPES)), rule=st.sampled_from(RULES), axis=st.sampled_from(["dim", "tokens"]),
       seed=st.integers(0, 2 ** 16), spread=st.sampled_from([1.0, 10.0, 40.0]))
@settings(max_examples=400, deadline=None)
def test_many_random_layouts_match_the_reference_on_the_gpu(lengths, heads, head_dim, dtype, rule, axis, seed, spread,
                                                            device):
    """The same on CUDA over wider shapes and more examples: the elements come from the hardware conversion, whose
    compiled code depends on the tile and the head dim (a D-axis tiling that met it miscompiled one lane at
    head_dim 2). Too slow for the interpreter."""
    if device == "cpu":
        pytest.skip("a GPU stress test: the interpreter runs test_random_layouts_match_the_reference")
    x = _heavy(np.random.default_rng(seed), (sum(lengths), heads, head_dim), spread=spread)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])).to(device)
    _check(torch.from_numpy(x).to(DTYPES[dtype]).to(device), axis, rule, cu if axis == "tokens" else None)


# ----------------------------------------------------------------------------------------------------
# dequantize
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", ["dim", "tokens"])
def test_dequantize_is_exact_in_fp32_and_rounds_to_the_input_dtype(axis, device):
    rng = np.random.default_rng(10)
    x = _heavy(rng, (50, 2, 40), spread=12.0)
    x[0, 0, 0] = np.nan
    cu = torch.tensor([0, 20, 20, 50], device=device) if axis == "tokens" else None
    for dtype in DTYPES.values():
        mx = _check(torch.from_numpy(x).to(dtype).to(device), axis, "floor", cu)
        want = ref.dequantize_mx(mx.data.view(torch.uint8).cpu().numpy(), mx.scales.cpu().numpy(), axis,
                                 None if cu is None else cu.cpu().numpy())
        got = mx.dequantize(torch.float32).cpu()
        assert np.array_equal(got.double().numpy(), want, equal_nan=True)
        rounded = mx.dequantize()
        assert rounded.dtype == dtype
        assert np.array_equal(rounded.float().cpu().numpy(), torch.from_numpy(want).to(dtype).float().numpy(),
                              equal_nan=True)


@pytest.mark.parametrize("rule", RULES)
def test_dequantize_error_bound(rule, device):
    """Per element, with s its scale exponent: |x^ - x| <= max(2^-4 |x|, 2^(s-10)) (half an E4M3 ulp:
    relative for normal elements, absolute in the subnormal range). RCEIL never saturates; under FLOOR the
    elements with |x| > 464 * 2^s saturate to 448 * 2^s, an error below 2^-3 |x| (|x| < 512 * 2^s)."""
    rng = np.random.default_rng(11)
    x = torch.from_numpy(_heavy(rng, (64, 2, 64), spread=8.0)).float().to(device)
    mx = _check(x, "dim", rule)
    xs = x.double().cpu().numpy()
    err = np.abs(mx.dequantize(torch.float32).double().cpu().numpy() - xs)
    s = mx.element_scales().cpu().numpy().astype(np.int64) - 127
    saturated = np.abs(xs) > np.ldexp(464.0, s)
    bound = np.maximum(2.0 ** -4 * np.abs(xs), np.ldexp(1.0, s - 10))
    assert np.all(err[~saturated] <= bound[~saturated])
    if rule == "rceil":
        assert not saturated.any()
    else:
        assert saturated.any(), "the sample should exercise FLOOR's saturation"
        assert np.all(err[saturated] < 2.0 ** -3 * np.abs(xs[saturated]))


# ----------------------------------------------------------------------------------------------------
# validation and packaging
# ----------------------------------------------------------------------------------------------------
def _x(**kw):
    return torch.zeros(kw.pop("shape", (4, 2, 32)), dtype=kw.pop("dtype", torch.float32))


BAD_CALLS = {
    "x-not-a-tensor": (lambda: jmx.quantize(np.zeros((4, 2, 32), np.float32), "dim"), TypeError,
                       "x: expected a torch.Tensor"),
    "x-float64": (lambda: jmx.quantize(_x(dtype=torch.float64), "dim"), TypeError, "x: dtype must be"),
    "x-int32": (lambda: jmx.quantize(_x(dtype=torch.int32), "dim"), TypeError, "x: dtype must be"),
    "x-2d": (lambda: jmx.quantize(_x(shape=(4, 32)), "dim"), ValueError, "x: expected shape [tokens, heads, head_dim]"),
    "axis-unknown": (lambda: jmx.quantize(_x(), "rows"), ValueError, "axis: must be one of"),
    "rule-unknown": (lambda: jmx.quantize(_x(), "dim", rule="ceil"), ValueError, "rule: must be one of"),
    "offsets-with-dim-axis": (lambda: jmx.quantize(_x(), "dim", torch.tensor([0, 4])), ValueError,
                              "cu_seqlens: only axis='tokens'"),
    "offsets-missing": (lambda: jmx.quantize(_x(), "tokens"), ValueError, "cu_seqlens: required"),
    "offsets-not-a-tensor": (lambda: jmx.quantize(_x(), "tokens", [0, 4]), TypeError,
                             "cu_seqlens: expected a torch.Tensor"),
    "offsets-float": (lambda: jmx.quantize(_x(), "tokens", torch.tensor([0.0, 4.0])), TypeError,
                      "cu_seqlens: offsets must be int32 or int64"),
    "offsets-2d": (lambda: jmx.quantize(_x(), "tokens", torch.tensor([[0, 4]])), ValueError,
                   "cu_seqlens: expected a 1-D"),
    "offsets-empty": (lambda: jmx.quantize(_x(), "tokens", torch.tensor([], dtype=torch.int32)), ValueError,
                      "cu_seqlens: expected a 1-D"),
    "offsets-first-not-0": (lambda: jmx.quantize(_x(), "tokens", torch.tensor([1, 4])), ValueError,
                            "cu_seqlens: first offset must be 0"),
    "offsets-decreasing": (lambda: jmx.quantize(_x(), "tokens", torch.tensor([0, 3, 2, 4])), ValueError,
                           "cu_seqlens: offsets must be non-decreasing, but cu_seqlens[2] < cu_seqlens[1]"),
    "offsets-last-not-total": (lambda: jmx.quantize(_x(), "tokens", torch.tensor([0, 3])), ValueError,
                               "cu_seqlens: last offset must equal the token count 4"),
}


@pytest.mark.parametrize("call, error, message", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments_raise_naming_the_argument_before_any_kernel(call, error, message, monkeypatch):
    from jfa.kernels.triton import mx_quant

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel ran before validation finished")

    monkeypatch.setattr(mx_quant, "quantize_dim", no_kernel)
    monkeypatch.setattr(mx_quant, "quantize_tokens", no_kernel)
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


@pytest.mark.parametrize("call, message", [
    (lambda: ref.quantize_mx(np.zeros((4, 32)), "rows"), "axis: must be one of"),
    (lambda: ref.quantize_mx(np.zeros((4, 32)), "dim", rule="ceil"), "rule: must be one of"),
    (lambda: ref.quantize_mx(np.zeros((4, 32)), "tokens"), "cu_seqlens: required"),
    (lambda: ref.quantize_mx(np.zeros((4, 32)), "tokens", [0, 3]), "cu_seqlens: last offset"),
    (lambda: ref.quantize_mx(np.zeros((4, 32)), "tokens", [0, 5, 4]), "cu_seqlens: offsets must be non-decreasing"),
], ids=["axis", "rule", "offsets-missing", "offsets-last", "offsets-decreasing"])
def test_the_reference_rejects_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call()


def test_mxtensor_rejects_inconsistent_parts():
    data = torch.zeros(4, 2, 40).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scales: expected shape"):
        jmx.MXTensor(data=data, scales=torch.zeros(4, 2, 1, dtype=torch.uint8), axis="dim", rule="floor")
    with pytest.raises(TypeError, match="scales: expected a 3-D torch.uint8"):
        jmx.MXTensor(data=data, scales=torch.zeros(4, 2, 2), axis="dim", rule="floor")
    with pytest.raises(ValueError, match="rule: must be one of"):
        jmx.MXTensor(data=data, scales=torch.zeros(4, 2, 2, dtype=torch.uint8), axis="dim", rule="up")


def test_scales_view_as_float8_e8m0fnu(device):
    x = torch.tensor([[[448.0 * 2.0 ** k] + [0.0] * 31] for k in (-127, 0, 119)]).to(device)
    mx = _check(x, "dim", "floor")
    assert mx.scales_e8m0.dtype == torch.float8_e8m0fnu
    assert mx.scales_e8m0.float().cpu().reshape(-1).tolist() == [2.0 ** -127, 1.0, 2.0 ** 119]


def test_token_scale_rows_bound_the_block_count():
    rng = np.random.default_rng(12)
    for _ in range(200):
        lengths = rng.integers(0, 100, rng.integers(0, 8))
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        T, B = int(cu[-1]), len(lengths)
        rows = jmx.token_scale_rows(T, B)
        assert ref.token_block_offsets(cu)[-1] <= rows <= T // 32 + B
        assert torch.equal(jmx.token_block_offsets(torch.from_numpy(cu)), torch.from_numpy(ref.token_block_offsets(cu)))


def test_importing_jfa_mx_loads_no_triton_and_no_harness():
    code = ("import sys, jfa.mx; print(sorted(m for m in sys.modules if m.startswith(('triton', 'jfa.oracle', "
            "'jfa.fuzz', 'jfa.sim', 'jfa.bench'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout
