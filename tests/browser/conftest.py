"""Browser fixtures: a real uvicorn server and Debian's chromium driven by Playwright.

No browser is downloaded: scripts/test.sh installs Debian's chromium and Playwright launches it
by path. Every page is watched: a JavaScript error, a console error or a request to any host
but 127.0.0.1 (the pages must work offline) fails the test after its body has run. Each test
leaves a screenshot in test-artifacts/screenshots/.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Route, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from api.app import create_app
from tests.browser.helpers import LOCAL_HOST, LiveServer, fill_dashboard_store, running_server
from tests.helpers import REPO

CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",  # tests run as root in containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Chromium's own calls home (updates, sync, field trials) would hang or fail offline.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
VIEWPORT = {"width": 1280, "height": 900}


@dataclass
class PageWatch:
    """What went wrong in a test's page; checked once the test body has passed.

    A test that expects an error says so: ``page_watch.allow_js_error("part of the message")``.
    """

    page: Page | None = None
    js_errors: list[str] = field(default_factory=list)
    offsite_requests: list[str] = field(default_factory=list)
    allowed_fragments: list[str] = field(default_factory=list)

    def allow_js_error(self, fragment: str) -> None:
        self.allowed_fragments.append(fragment)

    def problems(self) -> list[str]:
        unexpected = [
            error
            for error in self.js_errors
            if not any(fragment in error for fragment in self.allowed_fragments)
        ]
        return [f"JavaScript error: {error}" for error in unexpected] + [
            f"request to a host other than {LOCAL_HOST} (blocked): {url}"
            for url in self.offsite_requests
        ]


PAGE_WATCH = pytest.StashKey[PageWatch]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fail (not error) the test when its page misbehaved, even if every assertion held."""
    result = yield
    watch = item.stash.get(PAGE_WATCH, None)
    if watch is not None:
        if watch.page is not None and not watch.page.is_closed():
            # A round trip delivers console and error events still queued in the driver.
            with suppress(PlaywrightError):
                watch.page.evaluate("0")
        if problems := watch.problems():
            pytest.fail("the page misbehaved:\n  " + "\n  ".join(problems), pytrace=False)
    return result


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The app on a real port over a SQLite store filled by ``fill_dashboard_store``.

    One per test module: tests may add trials to LIVE_STUDY, nothing else changes the data.
    """
    storage_url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'sweeper.db'}"
    app = create_app(fill_dashboard_store(storage_url))
    with running_server(app) as base_url:
        yield LiveServer(base_url=base_url, storage_url=storage_url)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, once per session (launching takes about a second)."""
    executable = shutil.which("chromium") or CHROMIUM
    if not Path(executable).is_file():
        pytest.fail(
            f"chromium not found (looked for `chromium` on PATH and {CHROMIUM}). The browser "
            "tests need Debian's chromium: `apt-get update && apt-get install -y chromium` "
            "(scripts/test.sh does this). Do not run `playwright install`.",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=BROWSER_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page_watch(request: pytest.FixtureRequest) -> PageWatch:
    watch = PageWatch()
    request.node.stash[PAGE_WATCH] = watch
    return watch


@pytest.fixture
def page(browser: Browser, page_watch: PageWatch, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh context and page per test, offline but for 127.0.0.1, watched for errors."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(15_000)
    # a page's first load (a fresh server computing the study's tables, the browser parsing
    # plotly.js) took over 15 s once at load average 9-10 on 2 cores (CI, 2026-11-26: the
    # offers form's goto): navigation waits longer; what a test asserts keeps the 15 s
    context.set_default_navigation_timeout(60_000)

    def only_local(route: Route) -> None:
        url = route.request.url
        if urlsplit(url).hostname == LOCAL_HOST:
            route.continue_()
        else:
            page_watch.offsite_requests.append(url)
            route.abort("blockedbyclient")

    context.route("**/*", only_local)
    page = context.new_page()
    page_watch.page = page

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location
            page_watch.js_errors.append(
                f"console: {message.text} (at {where['url'] or '?'}:{where['lineNumber']})"
            )

    page.on("console", on_console)
    page.on("pageerror", lambda error: page_watch.js_errors.append(f"uncaught: {error.stack}"))
    page.on("crash", lambda _page: page_watch.js_errors.append("the page crashed"))
    try:
        yield page
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.name)
        # A debugging aid only: a crashed or closed page has already failed the test.
        with suppress(PlaywrightError):
            page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)
        context.close()
