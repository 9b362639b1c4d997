"""Hypothesis profiles for the property suite, registered once (conftest and ``jfa fuzz`` both use them).

- ``ci``: derandomised (same examples every run), bounded, no example database: fits the CI budget
  and never flakes; the default. ``ci-gpu``: the same with fewer examples, which the GPU suite loads in
  place of ``ci`` (each example there compiles new TLX and portable specialisations: 40 of them
  overran a 120 s per-test limit on 14 busy workers; the nightly fuzzer is the GPU's search). ``ci-suite``:
  the same number, which the CPU suite loads in place of ``ci`` unless it runs as the gate's
  (``--sim-scope full``): the suite's 15-minute budget on 2 cores; the gate keeps ``ci``'s 40.
- ``dev``: random, more examples, with the local example database (failures replay first).
- ``nightly``: random and effectively unbounded; ``jfa fuzz`` bounds it by wall time instead.
Select with ``--hypothesis-profile NAME`` or ``JFA_FUZZ_PROFILE=NAME`` (``jfa.knobs.fuzz_profile``, whose
choices are these names).
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

from jfa import knobs

PROFILES = ("ci", "ci-gpu", "ci-suite", "dev", "nightly")
_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def register_profiles() -> None:
    settings.register_profile("ci", max_examples=40, derandomize=True, database=None, **_common)
    settings.register_profile("ci-gpu", max_examples=12, derandomize=True, database=None, **_common)
    settings.register_profile("ci-suite", max_examples=12, derandomize=True, database=None, **_common)
    settings.register_profile("dev", max_examples=300, **_common)
    settings.register_profile("nightly", max_examples=10_000_000, **_common)


def load_default_profile() -> str:
    """Load the profile ``knobs.fuzz_profile`` names (``JFA_FUZZ_PROFILE``, default ci)."""
    name = knobs.fuzz_profile
    settings.load_profile(name)
    return name
