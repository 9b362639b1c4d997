"""Every JFA_* setting is declared once in jfa.knobs, typed, read at each access, and set for a block of
code with a scope; a value that does not parse names the variable."""
import threading

import pytest

from jfa import knobs

TEXTS = {  # knob -> (environment text, the value it means)
    "trust_offsets": (" TRUE ", True),
    "tlx_fused_dq": ("0", False),
    "tlx_variant": ("schedule=dynamic, peel-x=0", {"schedule": "dynamic", "peel_x": "0"}),
    "tlx_bwd_variant": ("persistent=0", {"persistent": "0"}),
    "tlx_own_waits": (" jagged_fwd_tlx_kernel , jagged_dkdv_tlx_kernel ",
                      frozenset({"jagged_fwd_tlx_kernel", "jagged_dkdv_tlx_kernel"})),
    "tlx_llvm_o0": ("1", True),
    "triton_config": ('{"forward": [64, 32, 4, 2]}', {"forward": [64, 32, 4, 2]}),
    "fuzz_profile": ("dev", "dev"),
    "test_device": ("cuda", "cuda"),
}
BAD = {"trust_offsets": "yes", "tlx_fused_dq": "on", "tlx_variant": "peel", "tlx_bwd_variant": "=1",
       "tlx_own_waits": "jagged_dkdv_kernel", "tlx_llvm_o0": ",", "triton_config": "[1, 2]",
       "fuzz_profile": "weekly", "test_device": "tpu"}


def test_every_knob_has_a_text_case_and_a_bad_case():
    assert set(TEXTS) == set(knobs.KNOBS) == set(BAD)
    assert all(k.env.startswith("JFA_") and k.doc for k in knobs.KNOBS.values())


@pytest.mark.parametrize("name", sorted(knobs.KNOBS))
def test_a_knob_reads_its_environment_variable_at_each_access(name, monkeypatch):
    knob = knobs.KNOBS[name]
    monkeypatch.delenv(knob.env, raising=False)
    assert knobs.get(name) == knob.default
    text, value = TEXTS[name]
    monkeypatch.setenv(knob.env, text)
    assert getattr(knobs, name) == value
    monkeypatch.setenv(knob.env, "  ")  # blank means unset
    assert knobs.get(name) == knob.default


@pytest.mark.parametrize("name", sorted(knobs.KNOBS))
def test_a_value_that_does_not_parse_names_the_variable(name, monkeypatch):
    knob = knobs.KNOBS[name]
    monkeypatch.setenv(knob.env, BAD[name])
    with pytest.raises(ValueError, match=knob.env):
        knobs.get(name)


def test_a_scope_beats_the_environment_and_restores_on_exit(monkeypatch):
    monkeypatch.setenv("JFA_TRUST_OFFSETS", "1")
    with knobs.scope(trust_offsets=False, tlx_variant="pingpong=0"):
        assert knobs.trust_offsets is False and knobs.tlx_variant == {"pingpong": "0"}
        with knobs.scope(trust_offsets=None):  # None: the default, whatever the environment says
            assert knobs.trust_offsets is False
        with knobs.scope(trust_offsets=True):
            assert knobs.trust_offsets is True
        assert knobs.trust_offsets is False
    assert knobs.trust_offsets is True and knobs.tlx_variant == {}


def test_a_scope_restores_on_an_exception():
    with pytest.raises(RuntimeError):
        with knobs.scope(tlx_fused_dq=False):
            raise RuntimeError
    assert knobs.tlx_fused_dq is True


def test_a_scope_is_seen_by_other_threads_while_it_is_open():
    """The autograd engine runs a CUDA backward on a thread of its own: it must see the caller's scope."""
    seen = []
    with knobs.scope(tlx_fused_dq=False):
        worker = threading.Thread(target=lambda: seen.append(knobs.tlx_fused_dq))
        worker.start()
        worker.join()
    assert seen == [False]


def test_overlapping_scopes_each_hold_until_their_own_end():
    outer = knobs.scope(trust_offsets=True)
    inner = knobs.scope(tlx_fused_dq=False)
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the outer block ends first (another thread's, say)
    assert knobs.tlx_fused_dq is False and knobs.trust_offsets is False
    inner.__exit__(None, None, None)
    assert knobs.tlx_fused_dq is True


def test_scope_values_are_checked_like_the_environment_text():
    with pytest.raises(ValueError, match="JFA_TLX_OWN_WAITS"):
        with knobs.scope(tlx_own_waits="not_a_kernel"):
            pass
    with pytest.raises(TypeError, match="JFA_TRUST_OFFSETS: expected a bool"):
        with knobs.scope(trust_offsets=1):
            pass
    with pytest.raises(AttributeError, match="no setting 'trust_offset'"):
        with knobs.scope(trust_offset=True):
            pass
    with knobs.scope(tlx_own_waits=["jagged_fwd_tlx_kernel"]):
        assert knobs.tlx_own_waits == frozenset({"jagged_fwd_tlx_kernel"})


def test_a_process_setting_sits_between_scopes_and_the_environment(monkeypatch):
    monkeypatch.setenv("JFA_TLX_FUSED_DQ", "1")
    knobs.set_process(tlx_fused_dq=False)
    try:
        assert knobs.tlx_fused_dq is False
        with knobs.scope(tlx_fused_dq=True):
            assert knobs.tlx_fused_dq is True
    finally:
        knobs.set_process(tlx_fused_dq=None)
    assert knobs.tlx_fused_dq is True


def test_describe_lists_every_setting_and_reports_a_bad_value(monkeypatch):
    monkeypatch.setenv("JFA_TRUST_OFFSETS", "maybe")
    rows = {env: current for env, current, _default, _doc in knobs.describe()}
    assert set(rows) == {k.env for k in knobs.KNOBS.values()}
    assert rows["JFA_TRUST_OFFSETS"].startswith("INVALID")
