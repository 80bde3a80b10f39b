import pytest


@pytest.fixture(autouse=True)
def _needs_engine(engine):
    """Every test here runs real containers on the real engine."""
    return engine
