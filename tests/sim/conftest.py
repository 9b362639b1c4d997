"""The simulator's tests run on the CPU interpreter only.

With ``--device cuda`` the interpreter is off (TRITON_INTERPRET is not set), and importing ``jfa.sim``
would fail collection; these tests are then not collected, which the session header says. On the CPU
(the default) they always run, and a broken setup (wrong Triton, interpreter off) fails them loudly.
"""


def _on_cuda(config) -> bool:
    try:
        return config.getoption("--device") == "cuda"
    except ValueError:  # run without the repository's root conftest
        return False


def pytest_ignore_collect(collection_path, config):
    if _on_cuda(config) and "tests/sim" in str(collection_path).replace("\\", "/"):
        return True
    return None


def pytest_report_header(config):
    if _on_cuda(config):
        return "tests/sim: not collected with --device cuda (the TLX simulator runs on the CPU interpreter)"
    return None
