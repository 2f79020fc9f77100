"""Issue 19: the inspector in a real browser. Debian's headless Chromium, driven by Playwright
(never `playwright install`: no browser is downloaded), opens the seed scenario's session,
sees its two epochs, the cleared messages and the seed, and its live view receives a run
appended while the page is open.

Without Chromium or Playwright the test skips (`tests/requirements.py`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.inspect.conftest import ASK, SEED, require_extra
from tests.inspect.test_command import base_of, inspector_process, seeded_store
from tests.requirements import unmet
from trimtab import Client, PermissionHandler
from trimtab.testing import ScriptedModel

require_extra()

if TYPE_CHECKING:
    from playwright.async_api import Page

CHROMIUM = Path(os.environ.get("TRIMTAB_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Offline and quiet: no update checks, no sync, no network but the inspector's."""


def require_browser() -> None:
    """Skip without Chromium or Playwright."""
    missing = [] if CHROMIUM.exists() else [f"{CHROMIUM} (apt-get install chromium)"]
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install -e '.[dev]')")
    if missing:
        unmet("the browser test needs " + " and ".join(missing))


@dataclass
class Browser:
    page: Page
    errors: list[str] = field(default_factory=list)
    """Console errors: a resource refused by the CSP, a script error, a failed request."""


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    """A page of a fresh Chromium profile, and the errors its console shows."""
    require_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh --user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield Browser(page, errors)
        finally:
            await context.close()


async def test_issue19_browser_sees_the_seed_scenario_and_follows_it_live(
    tmp_path: Path, browser: Browser
) -> None:
    page = browser.page
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store) as (url, _):
        await page.goto(url)  # the printed URL: its token is traded for a cookie
        assert page.url == base_of(url)  # and leaves the address bar
        await page.click(f"a[href*='{session_id}']")
        assert session_id in page.url

        # The session: two epochs, the clear in the timeline, the seeded run after it.
        segments = page.locator(".segments .segment")
        assert await segments.count() == 2
        assert await segments.nth(0).get_attribute("data-epoch") == "0"
        assert await segments.nth(1).get_attribute("data-epoch") == "1"
        clear = page.locator(".timeline .op-clear")
        assert "context cleared: 2 messages" in await clear.inner_text()
        assert SEED in await clear.inner_text()
        seeded = page.locator(".timeline .run.seeded .prompt")
        assert await seeded.inner_text() == SEED

        # The window of the seeded run's call: the cleared messages beside the seed.
        await page.click("text=window of the last model call")
        columns = page.locator(".windows .column")
        assert await columns.count() == 2
        removed = columns.nth(0).locator(".msg.removed")
        assert await removed.count() == 3
        assert ASK in await removed.nth(0).inner_text()
        assert "clear_context" in await removed.nth(1).inner_text()
        seed = columns.nth(1).locator(".msg.seed")
        assert SEED in await seed.inner_text()
        assert await columns.nth(1).locator(".msg").count() == 3  # system, developer, seed
        styled = await page.eval_on_selector(
            ".msg.removed", "e => getComputedStyle(e).backgroundColor"
        )
        assert styled == "rgb(253, 243, 242)"  # the stylesheet ran under the page's CSP

        # Live: a run appended by another runtime shows up while the page is open.
        await page.goto(base_of(url) + f"sessions/{session_id}?live=1")
        await page.wait_for_selector("#live-state:text('following')")
        async with Client(store=store) as client:
            session = await client.resume_session(
                session_id,
                provider=ScriptedModel(["LIVE_REPLY"]),
                on_permission_request=PermissionHandler.approve_all,
            )
            await session.send_and_wait("Still there?")
            await session.disconnect()
        reply = page.locator("#live li[data-type='assistant.message'] .detail")
        await reply.wait_for()
        assert await reply.inner_text() == "LIVE_REPLY"
        asked = page.locator("#live li[data-type='user.message'] .detail")
        assert await asked.inner_text() == "Still there?"
        assert await page.inner_text("#event-count") == "22"
    assert browser.errors == []
