"""Block-scaled tcgen05 MMA (``tlx.async_dot_scaled``) as the uTLX plugin this project builds with can compile it.

Two rules, both checked by compiling for sm_100a on a machine without a GPU (``jfa.fuzz.compile_gate``):

- The builtin calls gluon's ``create_tcgen05_mma_scaled`` with every argument Triton 3.8's binding takes (the
  plugin's own ``async_dot_scaled`` omits the trailing ``multicast`` flag and fails with a TypeError at compile
  time); ``install`` puts this version in ``triton.language.extra.tlx`` where the plugin's is that one.
- E8M0 scales go in shared memory, one 128-row tile of 4 bytes a row (``SCALE_TILE``), laid out as tcgen05.cp's
  ``32x128b.warpx4`` copy reads them (``scale_layout``: row m's 4 bytes at ``16 (m % 32) + 4 (m // 32)``); Triton
  copies them into tensor memory before the MMA. The builtin passes a scale tile with that explicit layout as it
  is (the plugin would force an NVMMA layout on it, which tcgen05.cp cannot read). Scales of another shape
  (fewer rows or columns) have no tcgen05.cp layout in Triton 3.8.

The TLX simulator replaces the builtin during a simulated launch (``jfa.sim``), whatever is installed here.
"""
from __future__ import annotations

SCALE_TILE = (128, 4)  # rows x E8M0 bytes of one shared-memory scale tile tcgen05.cp moves whole


def scale_layout():
    """The shared linear layout of a ``SCALE_TILE`` uint8 scale tile (tcgen05.cp ``32x128b.warpx4``): offset bits
    0-1 are the column, 2-3 the row's 32-row group, 4-8 the row within its group. None where TLX has no shared
    linear layouts (or no TLX)."""
    try:
        import triton.language.extra.tlx as tlx
    except ImportError:  # pragma: no cover - depends on the installed Triton
        return None
    if not hasattr(tlx, "shared_linear_layout_encoding"):  # pragma: no cover - depends on the installed Triton
        return None
    rows, cols = SCALE_TILE
    bases = [[0, 1 << i] for i in range(cols.bit_length() - 1)]
    bases += [[32 << i, 0] for i in range((rows // 32).bit_length() - 1)]
    bases += [[1 << i, 0] for i in range(5)]
    return tlx.shared_linear_layout_encoding(bases, alignment=16)


def _binding_takes_multicast() -> bool:
    """Whether gluon's ``create_tcgen05_mma_scaled`` binding takes the trailing ``multicast`` flag (13 arguments:
    a, b, acc, a_scale, b_scale, a_type, b_type, use_acc, pred, barriers, barrier_preds, two_ctas, multicast)."""
    from triton._C.libtriton import gluon_ir

    doc = getattr(gluon_ir.GluonOpBuilder, "create_tcgen05_mma_scaled").__doc__ or ""
    return "arg12:" in doc and "arg13:" not in doc


def _make_builtin():
    import triton.language as tl
    import triton.language.extra.tlx as tlx
    import utlx_plugin.mma_ops as mma

    @tl.core.builtin
    def async_dot_scaled(A, B, acc, A_scale, A_format, B_scale, B_format, use_acc=None, pred=None, mBarriers=None,
                         two_ctas=False, force_async=False, out_dtype=tl.float32, _semantic=None):
        """``acc (+)= (A x A_scale) @ (B x B_scale)`` on tcgen05 (module docstring)."""
        builder = _semantic.builder
        a_type = _semantic._str_to_fp_type(tl._unwrap_if_constexpr(A_format))
        b_type = _semantic._str_to_fp_type(tl._unwrap_if_constexpr(B_format))
        a_handle = mma.require_nv_mma_shared_layout(A, True, builder)
        b_handle = mma.require_nv_mma_shared_layout(B, True, builder)

        def scale(x):
            if x.type.storage == tlx.storage_kind.tmem:
                return mma.require_tmem_scales_layout(x, builder)
            if isinstance(x.type.layout, tlx.shared_linear_layout_encoding):
                return x.handle
            return mma.require_nv_mma_shared_layout(x, False, builder)

        acc_handle = mma.require_tmem_layout_col_stride(acc, 1, builder)
        bars = [t.handle for t in (mBarriers or [])]
        flag = None
        if use_acc is not None:
            flag = use_acc.handle if isinstance(use_acc, tl.tensor) else builder.get_int1(
                tl._unwrap_if_constexpr(use_acc))
        builder.create_tcgen05_mma_scaled(a_handle, b_handle, acc_handle, scale(A_scale), scale(B_scale), a_type,
                                          b_type, mma._i1_or_true(builder, flag), mma._i1_or_true(builder, pred), bars,
                                          mma._mbarrier_preds(builder, bars), bool(tl._unwrap_if_constexpr(two_ctas)),
                                          False)
        return tl.tensor(acc_handle, tl.void)

    return async_dot_scaled


def install() -> None:
    """Put this module's ``async_dot_scaled`` into ``triton.language.extra.tlx`` (module docstring); idempotent, a
    no-op without the uTLX plugin or with a gluon binding of another arity."""
    try:
        import triton.language.extra.tlx as tlx
        import utlx_plugin.mma_ops  # noqa: F401 - the plugin's helpers the builtin calls
    except ImportError:  # pragma: no cover - depends on the installed Triton
        return
    if getattr(tlx.async_dot_scaled, "_jfa_scaled_mma", False) or not _binding_takes_multicast():
        return
    builtin = _make_builtin()
    builtin._jfa_scaled_mma = True
    tlx.async_dot_scaled = builtin
