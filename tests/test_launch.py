"""The direct launch (``jfa.kernels.launch``): one launch signature never stands for two Triton
specialisations, a repeated signature skips Triton's binding and launches the kept compiled kernel with
every argument in parameter order, and anything it cannot describe takes Triton's own path.

Checked on the CPU: the kernels here are real ``JITFunction``s (not the interpreter's), bound through
Triton's own binder with an offline driver (the compile gate's), and the "compiled kernel" a first
launch returns is a recorder."""
import contextlib

import pytest
import torch
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from jfa.fuzz.compile_gate import _OfflineDriver
from jfa.kernels import launch as fast
from jfa.kernels.tlx import pipeline
from jfa import knobs


def probe_kernel(X, Y, DESC, n, m, scale, flag, BLOCK: tl.constexpr, MODE: tl.constexpr = 1):
    pass


def unspecialised_kernel(X, n, count):
    pass


PROBE = JITFunction(probe_kernel)
UNSPECIALISED = JITFunction(unspecialised_kernel, do_not_specialize=["count"])


@contextlib.contextmanager
def offline_driver():
    from triton.runtime.driver import driver

    saved = driver._active
    driver.set_active(_OfflineDriver())
    try:
        yield
    finally:
        driver.set_active(saved)


def triton_specialisation(kernel, args, kwargs):
    """What Triton's own binder makes of a launch: the per-argument specialisation and the options."""
    binder = kernel.device_caches[0][4]
    _, specialisation, options = binder(*args, **kwargs)
    return tuple(specialisation), tuple(sorted((k, str(v)) for k, v in options.items()))


INTS = st.sampled_from([0, 1, 2, 15, 16, 17, 32, 2**31 - 1, 2**31, 2**32 + 16, -1, -16, 2**63 - 16, 2**63])
DTYPES = st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.int32])
BASE = torch.zeros(4096, dtype=torch.uint8)


@st.composite
def tensors(draw):
    dtype = draw(DTYPES)
    size = torch.empty((), dtype=dtype).element_size()
    offset = draw(st.sampled_from([0, 1, 2, 4, 8, 16, 32]))  # elements past a 256-byte aligned base
    view = BASE.view(dtype)
    return view[offset:offset + 64 // size]


@st.composite
def descriptors(draw):
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16]))
    rows, cols = draw(st.sampled_from([(64, 128), (128, 64), (16, 32)]))
    base = torch.zeros(256, 256, dtype=dtype)
    return TensorDescriptor(base, shape=[256, 256], strides=[256, 1], block_shape=[rows, cols],
                            padding=draw(st.sampled_from(["zero", "nan"])))


@st.composite
def probe_launches(draw):
    args = (draw(tensors()), draw(tensors()), draw(descriptors()), draw(INTS), draw(INTS),
            draw(st.sampled_from([0.5, -2.0, 1e30])), draw(st.booleans()))
    kwargs = dict(BLOCK=draw(st.sampled_from([16, 32])), num_warps=draw(st.sampled_from([4, 8])))
    if draw(st.booleans()):
        kwargs["MODE"] = draw(st.sampled_from([1, 2]))
    return args, kwargs


def launch_signature(kernel, args, kwargs):
    launches = fast._KernelLaunches(kernel)
    values, options = launches.bind(args, kwargs)
    return launches.signature(values, options, device=0)


@settings(max_examples=150, deadline=None)
@given(st.lists(probe_launches(), min_size=2, max_size=6))
def test_one_launch_signature_never_stands_for_two_triton_specialisations(launches):
    seen = {}
    with offline_driver():
        for args, kwargs in launches:
            key = launch_signature(PROBE, args, kwargs)
            assert key is not None
            spec = triton_specialisation(PROBE, args, kwargs)
            assert seen.setdefault(key, spec) == spec, f"signature {key} named two specialisations"


def test_launch_signature_separates_what_triton_separates_on_simple_arguments():
    x = BASE.view(torch.float16)
    with offline_driver():
        for a, b in [((x[0:8], 16, 3), (x[1:9], 16, 3)),  # 16-byte aligned address or not
                     ((x[0:8], 16, 3), (x[0:8], 17, 3)),  # n divisible by 16 or not
                     ((x[0:8], 1, 3), (x[0:8], 2, 3)),  # n == 1 is a constant to Triton
                     ((x[0:8], 16, 3), (x[0:8], 2**31 + 16, 3))]:  # i32 or i64
            assert triton_specialisation(UNSPECIALISED, a, {}) != triton_specialisation(UNSPECIALISED, b, {})
            assert launch_signature(UNSPECIALISED, a, {}) != launch_signature(UNSPECIALISED, b, {})


def test_launch_signature_follows_the_pipeline_build_settings():
    x = BASE.view(torch.float16)[:8]
    with knobs.scope(tlx_own_waits=False):
        off = launch_signature(UNSPECIALISED, (x, 16, 3), {})
    with knobs.scope(tlx_own_waits=True):
        on = launch_signature(UNSPECIALISED, (x, 16, 3), {})
    with pipeline.build_llvm_o0("unspecialised_kernel", True):
        o0 = launch_signature(UNSPECIALISED, (x, 16, 3), {})
    assert len({off, on, o0}) == 3


class RecordedCompiledKernel:
    """What a first launch returns: records each direct launch (grid, stream, argument values)."""

    function = "function-handle"
    packed_metadata = "metadata"

    def __init__(self):
        self.launches = []

    def run(self, grid_x, grid_y, grid_z, stream, function, metadata, launch_metadata, enter, exit_, *values):
        assert (function, metadata, launch_metadata, enter, exit_) == ("function-handle", "metadata", None, None, None)
        self.launches.append(((grid_x, grid_y, grid_z), stream, values))


@pytest.fixture
def triton_launches(monkeypatch):
    """Every launch that goes through Triton's own path (``JITFunction.run``), recorded; each returns the
    same recorder as its "compiled kernel"."""
    compiled = RecordedCompiledKernel()
    calls = []

    def run(self, *args, grid, warmup, **kwargs):
        calls.append((self.fn.__name__, grid, args, kwargs))
        return compiled

    monkeypatch.setattr(JITFunction, "run", run)
    fast.clear()
    with offline_driver():
        yield calls, compiled
    fast.clear()


def test_a_repeated_signature_launches_the_kept_kernel_with_every_argument_in_order(triton_launches):
    calls, compiled = triton_launches
    x, y = BASE.view(torch.float16)[:8], BASE.view(torch.float16)[16:24]
    desc = TensorDescriptor(torch.zeros(64, 64, dtype=torch.float16), shape=[64, 64], strides=[64, 1],
                            block_shape=[16, 32])
    fast.launch(PROBE, (3,), x, y, desc, 32, 7, 0.5, True, BLOCK=16, num_warps=4)
    assert len(calls) == 1 and compiled.launches == []
    fast.launch(PROBE, (5, 2), y, x, desc, 48, 9, 0.25, False, BLOCK=16, num_warps=4)
    assert len(calls) == 1, "the second launch of one signature went through Triton's binder"
    assert compiled.launches == [((5, 2, 1), 0, (y, x, desc, 48, 9, 0.25, False, 16, 1))]


def test_a_new_signature_goes_through_triton_once(triton_launches):
    calls, compiled = triton_launches
    aligned, unaligned = BASE.view(torch.float16)[:8], BASE.view(torch.float16)[1:9]
    fast.launch(UNSPECIALISED, (1,), aligned, 16, 3)
    fast.launch(UNSPECIALISED, (1,), unaligned, 16, 3)  # unaligned: another binary
    fast.launch(UNSPECIALISED, (1,), unaligned, 32, 4)  # the same signature as the one before
    fast.launch(UNSPECIALISED, (1,), aligned, 16, 2**40)  # count, never specialised, still typed i64
    assert len(calls) == 3
    assert len(compiled.launches) == 1
    grid, stream, values = compiled.launches[0]
    assert values[0] is unaligned and values[1:] == (32, 4)


def test_instrumented_launches_always_take_tritons_path(triton_launches):
    from triton import knobs as triton_knobs

    calls, compiled = triton_launches
    x = BASE.view(torch.float16)[:8]
    fast.launch(UNSPECIALISED, (1,), x, 16, 3)
    hook = lambda metadata: None  # noqa: E731 - what a profiler adds
    triton_knobs.runtime.launch_enter_hook.add(hook)
    try:
        fast.launch(UNSPECIALISED, (1,), x, 16, 3)
    finally:
        triton_knobs.runtime.launch_enter_hook.remove(hook)
    assert len(calls) == 2 and compiled.launches == []


@pytest.mark.parametrize("args, kwargs", [((16,), {}), ((16, 3, 4), {}), ((16, 3), {"n": 5})],
                         ids=["missing", "too-many", "given-twice"])
def test_a_call_triton_would_refuse_is_left_to_tritons_error(triton_launches, args, kwargs):
    calls, compiled = triton_launches
    for _ in range(2):
        fast.launch(UNSPECIALISED, (1,), BASE.view(torch.float16)[:8], *args, **kwargs)
    assert len(calls) == 2 and compiled.launches == []


def test_cluster_launches_always_take_tritons_path(triton_launches):
    """uTLX rescales the grid of a ctas_per_cga launch inside Triton's path: never launched directly."""
    calls, compiled = triton_launches
    x = BASE.view(torch.float16)[:8]
    for _ in range(2):
        fast.launch(UNSPECIALISED, (2,), x, 16, 3, ctas_per_cga=(2, 1, 1))
        fast.launch(UNSPECIALISED, (2,), x, 16, 3, num_ctas=2)
    assert len(calls) == 4 and compiled.launches == []


def test_a_prepared_launch_replaces_the_named_arguments_and_keeps_the_rest(triton_launches):
    calls, compiled = triton_launches
    x, y, z = (BASE.view(torch.float16)[i:i + 8] for i in (0, 16, 32))
    desc = TensorDescriptor(torch.zeros(64, 64, dtype=torch.float16), shape=[64, 64], strides=[64, 1],
                            block_shape=[16, 32])
    args, kwargs = (x, y, desc, 32, 7, 0.5, True), dict(BLOCK=16, num_warps=4)
    fast.launch(PROBE, (3,), *args, **kwargs)
    prepared = fast.prepare(PROBE, args, kwargs, ("Y", "X"))
    assert prepared is not None
    assert prepared.run((4,), (z, y)) is True
    assert len(calls) == 1
    assert compiled.launches == [((4, 1, 1), 0, (y, z, desc, 32, 7, 0.5, True, 16, 1))]


def test_a_prepared_launch_refuses_a_replacement_that_changes_the_signature(triton_launches):
    calls, compiled = triton_launches
    aligned, unaligned = BASE.view(torch.float16)[:8], BASE.view(torch.float16)[1:9]
    as_float = BASE.view(torch.float32)[:8]
    fast.launch(UNSPECIALISED, (1,), aligned, 16, 3)
    prepared = fast.prepare(UNSPECIALISED, (aligned, 16, 3), {}, ("X",))
    assert prepared.run((1,), (unaligned,)) is False  # another binary: Triton's path must pick it
    assert prepared.run((1,), (as_float,)) is False
    assert compiled.launches == []
    assert prepared.run((1,), (aligned,)) is True and len(compiled.launches) == 1


def test_nothing_is_prepared_before_the_first_launch_or_for_a_cluster_launch(triton_launches):
    x = BASE.view(torch.float16)[:8]
    assert fast.prepare(UNSPECIALISED, (x, 16, 3), {}, ("X",)) is None
    fast.launch(UNSPECIALISED, (1,), x, 16, 3)
    assert fast.prepare(UNSPECIALISED, (x, 16, 3), {"num_ctas": 2}, ("X",)) is None
    relaunch = fast.prepare_or_relaunch(UNSPECIALISED, (x, 16, 4), {}, ("X",))
    assert isinstance(relaunch, fast.Prepared)  # (16, 4): the signature of (16, 3)


def test_a_prepared_launch_yields_to_a_hook_set_later(triton_launches):
    from triton import knobs as triton_knobs

    calls, compiled = triton_launches
    x = BASE.view(torch.float16)[:8]
    fast.launch(UNSPECIALISED, (1,), x, 16, 3)
    prepared = fast.prepare(UNSPECIALISED, (x, 16, 3), {}, ("X",))
    hook = lambda metadata: None  # noqa: E731 - what a profiler adds
    triton_knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert prepared.run((1,), (x,)) is False
    finally:
        triton_knobs.runtime.launch_enter_hook.remove(hook)
    assert compiled.launches == []


def test_a_relaunch_goes_through_the_usual_launch_with_the_arguments_replaced():
    seen = []
    relaunch = fast.Relaunch(lambda kernel, grid, args, kwargs: seen.append((grid, args, kwargs)), PROBE,
                             ("x", "y", "desc", 1), {"m": 2, "BLOCK": 16}, ("Y", "m"))
    assert relaunch.run((7,), ("new-y", 5)) is True
    assert seen == [((7,), ("x", "new-y", "desc", 1), {"m": 5, "BLOCK": 16})]
