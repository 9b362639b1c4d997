"""What a TLX launch does on the host, checked on CPU tensors with the kernels stubbed out.

A model calls the op once per layer with the same offsets tensors, so everything derived from them (tile
lists, the statistics' column layout, validation) is built once; a repeated launch only allocates its
outputs and launches its kernels. No launch reads a tensor back to the host (a stream sync)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from jfa.kernels import schedule
from jfa.kernels.schedule import virtual_cu_seqlens
from jfa.kernels.tlx.common.host import work_counter
from jfa.kernels.tlx.common.target import LaunchTarget, register_target
from jfa.kernels.tlx.hopper import backward as tlx_backward
from jfa.kernels.tlx.hopper import forward as tlx_forward
from jfa.kernels.tlx.hopper import row_stats as stats_pass

HEADS = 4
# aten ops that copy a device value to the host (item(), tolist(), bool(tensor), nonzero's size)
HOST_READS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default"}


class OpLog(TorchDispatchMode):
    """Every aten op run inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class StubKernel:
    """Stands in for a jitted kernel: records each launch's grid instead of running it."""

    def __init__(self, kernel, launches: list):
        self.fn = kernel.fn
        self._launches = launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launches.append((self.fn.__name__, grid))


@pytest.fixture
def launches(monkeypatch):
    """The TLX launchers on CPU tensors: a launch target that records each TLX launch instead of running
    it (sm_90, 132 SMs), the statistics' plain Triton kernel recorded too; the host caches empty (so a
    first call builds)."""
    recorded = []
    schedule._tile_lists.clear()
    stats_pass._column_layouts.clear()
    virtual_cu_seqlens.cache_clear()
    monkeypatch.setattr(stats_pass, "row_stats_kernel", StubKernel(stats_pass.row_stats_kernel, recorded))
    work_counter(torch.device("cpu"))  # made once per device: not part of a call's own work

    def record(kernel, grid, args, kwargs):
        recorded.append((kernel.fn.__name__, grid))

    previous = register_target("cpu", LaunchTarget("recorder", (9, 0), 132, record))
    yield recorded
    register_target("cpu", previous)


def _problem(broadcast_q: bool, head_dim: int):
    cu = torch.tensor([0, 300, 300, 1000, 1001], dtype=torch.int32)  # an empty and a one-token sequence
    total_k = int(cu[-1])
    q = torch.randn(256 if broadcast_q else total_k, HEADS, head_dim, dtype=torch.bfloat16)
    k = torch.randn(total_k, HEADS, head_dim, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kwargs = dict(causal=False, softmax_scale=head_dim ** -0.5, broadcast_q=broadcast_q, num_seqs=cu.numel() - 1,
                  len_q_bcast=q.shape[0] if broadcast_q else 0)
    return q, k, v, None if broadcast_q else cu, cu, kwargs


def _ops_of(call):
    with OpLog() as log:
        result = call()
    return log.ops, result


CASES = [pytest.param(b, d, id=f"{'broadcast-q' if b else 'jagged'}-d{d}") for b in (False, True) for d in (64, 128)]


@pytest.mark.parametrize("broadcast_q,head_dim", CASES)
def test_a_repeated_forward_only_allocates_its_outputs(launches, broadcast_q, head_dim):
    q, k, v, cu_q, cu_k, kwargs = _problem(broadcast_q, head_dim)
    first, _ = _ops_of(lambda: tlx_forward.jagged_forward_tlx(q, k, v, cu_q, cu_k, **kwargs))
    again, _ = _ops_of(lambda: tlx_forward.jagged_forward_tlx(q, k, v, cu_q, cu_k, **kwargs))
    assert "aten.searchsorted.Tensor" in first, "the first call builds the tile list"
    assert again == ["aten.empty.memory_format"] * 2, "out and lse, nothing derived from the offsets"
    assert [name for name, _ in launches] == ["jagged_fwd_tlx_kernel"] * 2


@pytest.mark.parametrize("broadcast_q,head_dim", CASES)
def test_a_repeated_fused_backward_only_allocates_and_reads_out_dq(launches, broadcast_q, head_dim):
    q, k, v, cu_q, cu_k, kwargs = _problem(broadcast_q, head_dim)
    rows = kwargs["num_seqs"] * q.shape[0] if broadcast_q else q.shape[0]
    out, dout = torch.randn(rows, HEADS, head_dim, dtype=q.dtype), torch.randn(rows, HEADS, head_dim, dtype=q.dtype)
    lse = torch.randn(rows, HEADS)
    call = lambda: tlx_backward.jagged_backward_tlx(q, k, v, out, lse, dout, cu_q, cu_k, **kwargs)  # noqa: E731
    first, _ = _ops_of(call)
    again, (dq, dk, dv) = _ops_of(call)
    assert "aten.cumsum.out" in first, "the first call lays out the statistics' columns"
    expected = ["aten.empty.memory_format"] * 3  # dk, dv and dq's fp32 accumulator
    if broadcast_q:
        expected.append("aten.zero_.default")  # the statistics' pass covers output rows, not q's: zeroed here
    expected += ["aten.zeros.default",  # the statistics (their gaps must read 0)
                 "aten._to_copy.default"]  # dq read out of its fp32 accumulator
    assert again == expected
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert [name for name, _ in launches] == ["row_stats_kernel", "jagged_dkdv_tlx_kernel"] * 2


@pytest.mark.parametrize("broadcast_q,head_dim", CASES)
def test_no_launch_reads_a_device_value_back_to_the_host(launches, broadcast_q, head_dim):
    q, k, v, cu_q, cu_k, kwargs = _problem(broadcast_q, head_dim)
    forward_ops, (out, lse) = _ops_of(lambda: tlx_forward.jagged_forward_tlx(q, k, v, cu_q, cu_k, **kwargs))
    backward_ops, _ = _ops_of(lambda: tlx_backward.jagged_backward_tlx(
        q, k, v, out, lse, torch.randn_like(out), cu_q, cu_k, **kwargs))
    assert not HOST_READS & set(forward_ops + backward_ops)


def test_the_column_layout_is_rebuilt_when_the_offsets_change():
    cu = torch.tensor([0, 5, 5, 40])
    cols, width = stats_pass.aligned_columns(cu, 3, 40)
    assert stats_pass.aligned_columns(cu, 3, 40)[0] is cols, "same unmodified tensor: reused"
    assert cols.tolist() == [0, 32, 32, 96] and width % stats_pass.COLUMN_ALIGN == 0 and width >= 96
    cu[2] = 10  # in place: the version counter moves
    assert stats_pass.aligned_columns(cu, 3, 40)[0].tolist() == [0, 32, 64, 96]



def _half_the_blocks(q, k, cu_q, cu_k, block_size: int = 128):
    """BlockLists of the reference selection at keep 0.5 (a caller's lists made beforehand)."""
    from jfa.kernels.block_lists import from_csr
    from jfa.kernels.schedule import num_tile_slots
    from jfa.reference import select_kv_blocks_reference

    offsets, indices = select_kv_blocks_reference(q, k, cu_q, cu_k, block_size=block_size, keep_ratio=0.5)
    heads, num_seqs = q.shape[1], cu_k.numel() - 1
    return from_csr(offsets, indices, block_size=block_size, num_heads=heads,
                    num_q_blocks=(offsets.numel() - 1) // heads,
                    num_q_slots=num_tile_slots(q.shape[0], num_seqs, block_size))


def test_a_repeated_sparse_forward_with_the_same_lists_only_allocates_its_outputs(launches):
    """The work list (query blocks ordered by their listed blocks) follows from the lists' offsets: built by the
    first call with those lists, not again."""
    q, k, v, cu_q, cu_k, kwargs = _problem(False, 128)
    lists = _half_the_blocks(q, k, cu_q, cu_k)
    kwargs = {name: kwargs[name] for name in ("causal", "softmax_scale", "broadcast_q", "num_seqs")}
    call = lambda: tlx_forward.block_sparse_forward_tlx(q, k, v, cu_q, cu_k, lists, **kwargs)  # noqa: E731
    first, _ = _ops_of(call)
    again, _ = _ops_of(call)
    assert "aten.sort.stable" in first, "the first call orders the work list"
    assert again == ["aten.empty.memory_format"] * 2, "out and lse, nothing derived from the lists"
    assert [name for name, _ in launches] == ["jagged_fwd_tlx_kernel"] * 2
