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
