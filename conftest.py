"""Root pytest configuration: which device the suite runs on.

``--device cpu`` (default) runs the portable kernels in Triton's CPU interpreter, which is
process-wide and must be switched on before triton is imported: that happens here, in
pytest_configure, before any test module is collected. ``--device cuda`` runs the same tests on the GPU.
``JFA_TEST_DEVICE`` (``jfa.knobs.test_device``) sets the default. Under pytest-xdist the controller
shares the cores out before it starts the workers (``jfa.fuzz.cores``: cores // workers CPU threads
each), so any ``-n`` is stable.
"""
import os
import sys
import zlib

import pytest

from jfa import knobs
from jfa.fuzz.profiles import load_default_profile, register_profiles

register_profiles()
load_default_profile()  # ci unless JFA_FUZZ_PROFILE or --hypothesis-profile says otherwise


def pytest_addoption(parser):
    parser.addoption("--device", default=knobs.test_device, choices=("cpu", "cuda"),
                     help="device the kernel tests run on (cpu = Triton interpreter)")
    parser.addoption("--sim-scope", default="core", choices=("core", "full"),
                     help="the TLX kernels on the CPU simulator: core (the CI suite: every shipped build, "
                          "deterministic and 3 seeds on a subset) or full (the gate: the whole TLX catalogue "
                          "under the deterministic schedule and 3 seeds)")
    parser.addoption("--backend", default="auto", choices=("auto", "tlx", "triton", "torch"),
                     help="jfa backend the kernel tests exercise (auto: TLX where it applies on a Hopper GPU, "
                          "else the portable kernel; tlx: cases it cannot run are skipped)")
    parser.addoption("--part", default=None, metavar="I/N",
                     help="only part I of N (0 <= I < N) of the collected tests, a test's part a hash of its id: "
                          "N runs with I = 0 .. N-1 run each test once (a suite longer than one sitting)")


def _part(value: str) -> tuple:
    """``--part I/N`` -> (I, N); a clear usage error otherwise."""
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--part: expected I/N (two integers), got {value!r}") from None
    if not 0 <= index < count:
        raise pytest.UsageError(f"--part: need 0 <= I < N, got {value!r}")
    return index, count


def pytest_configure(config):
    from hypothesis import settings

    from jfa.fuzz.cores import share_cores

    workers = getattr(config.option, "numprocesses", None)
    if not hasattr(config, "workerinput") and isinstance(workers, int) and workers > 0:
        share_cores(os.environ, workers)  # inherited by the workers xdist starts after configure

    if config.getoption("--device") == "cuda" and settings.get_current_profile_name() == "ci":
        settings.load_profile("ci-gpu")  # fewer derandomised examples: each compiles GPU specialisations
    elif config.getoption("--sim-scope") != "full" and settings.get_current_profile_name() == "ci":
        settings.load_profile("ci-suite")  # the CPU suite's budget: the gate (--sim-scope full) keeps ci's
    if config.getoption("--device") == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise pytest.UsageError("triton was imported before the interpreter could be enabled; "
                                    "run with TRITON_INTERPRET=1")
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--part"):
        index, count = _part(config.getoption("--part"))
        kept, others = [], []
        for item in items:
            (kept if zlib.crc32(item.nodeid.encode()) % count == index else others).append(item)
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = kept
    if config.getoption("--sim-scope") != "full":
        skip_slow = pytest.mark.skip(reason="slow: the gate runs it (jfa gate, or --sim-scope full); the CPU suite "
                                            "leaves it out to stay within its 15-minute budget")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    if config.getoption("--device") == "cuda":
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run with --device cuda on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
