"""Real-browser tests of the admin screens: Playwright driving the system Chromium.

They skip when the playwright package or Chromium is missing, unless GATOR_BROWSER_TESTS=required
(``make test-browser``, CI), when they fail instead. ``make browser-deps`` installs both.
"""
