import fcntl
import json
import os

import pytest
import torch


@pytest.fixture(scope="session")
def device(request) -> str:
    name = request.config.getoption("--device")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.exit("--device cuda was asked for, but torch sees no CUDA GPU", returncode=4)
    return name


@pytest.fixture(scope="session")
def backend(request) -> str:
    return request.config.getoption("--backend")


@pytest.fixture(scope="session")
def compile_gate(tmp_path_factory):
    """``compile_gate(backend, only=())``: the offline compile gate's results for "triton" or "tlx" (``only``:
    just these targets), computed once per test session and shared by every xdist worker (a file under the
    session's base temp directory, guarded by a lock): the compiles run in parallel child processes instead
    of once per worker."""
    def results(backend: str, only: tuple = ()) -> dict:
        from jfa.fuzz.compile_gate import run_out_of_process

        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return run_out_of_process(backend, only=only)
        shared = tmp_path_factory.getbasetemp().parent  # this session's, the same for every xdist worker
        name = f"compile-gate-{backend}-{len(only)}"
        path = shared / f"{name}.json"
        with open(shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker compiles, the others wait and read
            if not path.exists():
                partial = path.with_suffix(".partial")  # a worker killed mid-write leaves no half file
                partial.write_text(json.dumps(run_out_of_process(backend, only=only)))
                partial.replace(path)
            return json.loads(path.read_text())

    return results
