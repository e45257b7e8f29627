"""The launch fault tests' caller server (launch_callers) ends with the session that started it."""

import launch_callers
import pytest


@pytest.fixture(scope="session", autouse=True)
def _close_the_caller_server():
    yield
    launch_callers.close()
