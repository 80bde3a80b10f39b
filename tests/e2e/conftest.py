import pytest


@pytest.fixture(autouse=True)
def _needs_engine(engine):
    """Every test here runs real containers on the real engine."""
    return engine


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium for a module's tests of `quinebox view` (view_browser.py); a missing one fails them."""
    from view_browser import Browser

    opened = Browser()
    yield opened
    opened.close()
