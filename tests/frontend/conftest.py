# The browser fixtures live in tests/browser.py and are registered once, in tests/conftest.py,
# so every suite shares one Playwright session (two sessions in one thread break each other).
from tests.browser import login, shot  # noqa: F401
