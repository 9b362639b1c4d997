"""Sharing the machine's cores between worker processes (pytest-xdist workers, fuzz workers).

The oracle and the reference run on the CPU through NumPy's BLAS and torch's OpenMP pool, which by
default each take every core: N workers then run N x cores threads and starve each other into
timeouts (on the 16-core H200 host, 12 xdist workers lost 4 to "node down"). Each worker gets
``cores // workers`` threads (at least 1) through the variables the libraries read at start-up, set
in the environment the workers are started with. A value the caller set explicitly wins.
"""
from __future__ import annotations

import os
from typing import MutableMapping, Optional

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_per_worker(workers: int, cores: Optional[int] = None) -> int:
    """CPU threads each of ``workers`` processes gets: ``cores // workers``, at least 1."""
    if workers < 1:
        raise ValueError(f"workers: must be >= 1, got {workers}")
    return max(1, (usable_cores() if cores is None else cores) // workers)


def share_cores(env: MutableMapping[str, str], workers: int, cores: Optional[int] = None) -> int:
    """Set the thread variables in ``env`` (a process environment to start workers with) for ``workers``
    processes sharing ``cores``, leaving any the caller already set. Returns the threads per worker."""
    threads = threads_per_worker(workers, cores)
    for name in THREAD_VARIABLES:
        env.setdefault(name, str(threads))
    return threads
