import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts with an empty Dynamo cache, so captures never see another test's graphs."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
