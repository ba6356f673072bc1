"""Supply the implementation from your own suite: one built once per session, on your device."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--kernels-device", default=None, help="judge Kernels built on this device")


@pytest.fixture(scope="session")
def conformance_impl(request):
    device = request.config.getoption("--kernels-device")
    if device is None:  # the plugin's own: --conformance-impl builds it (with isolation)
        from v41_conformance.pytest_cases import FROM_OPTION

        return FROM_OPTION
    from mykernels import Kernels

    return Kernels(device=device)
