"""The environment the simulator is built for, checked when ``jfa.sim`` is imported.

It rides on internals of Triton's numpy interpreter and on the TLX op signatures of one triton-utlx
release, so it pins both exactly; and it needs the interpreter itself on, which Triton decides when a
``@triton.jit`` decorator runs (TRITON_INTERPRET=1 must be set before triton is imported).
"""
from __future__ import annotations

import os
import sys
from importlib import metadata

from .errors import SimSetupError

PINS = {"triton": "3.8.0", "triton-utlx": "3.8.0.post16"}


def check_versions() -> None:
    problems = []
    for dist, wanted in PINS.items():
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            have = None
        if have != wanted:
            problems.append(f"{dist}=={wanted} is needed, {'found ' + have if have else 'it is not installed'}")
    if problems:
        raise SimSetupError("jfa.sim cannot run here: " + "; ".join(problems)
                            + f" (pip install 'triton=={PINS['triton']}' 'triton-utlx=={PINS['triton-utlx']}')")


def check_interpreter() -> None:
    flag = os.environ.get("TRITON_INTERPRET", "")
    on = flag.strip().lower() in ("1", "true", "on", "yes")
    if "triton" in sys.modules:
        from triton import knobs
        on = bool(knobs.runtime.interpret)
    if not on:
        raise SimSetupError("jfa.sim needs Triton's CPU interpreter: set TRITON_INTERPRET=1 in the environment before "
                            f"triton is imported (found TRITON_INTERPRET={flag!r})")


def check() -> None:
    check_versions()
    check_interpreter()
