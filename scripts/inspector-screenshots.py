"""Take the README's screenshots of `trimtab inspect`, with the browser its test uses.

    python scripts/inspector-screenshots.py [--out docs]

Writes a few sessions to a fresh SQLite store with the real runtime (scripted at the model
boundary, like the tests): the seed scenario, in which a terminal `clear_context` tool clears
the context and the seeded run answers; a session with tool calls and a compaction; one
whose model call failed; and a long one that clears its context every few runs. Then it runs
`trimtab inspect` on that store and photographs the sessions page, the seed scenario's
session and the window of its last model call, and the long session's usage chart, with
Debian's headless Chromium, driven by Playwright (`apt-get install chromium`; nothing is
downloaded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

from pydantic import BaseModel

from trimtab import (
    Client,
    PermissionHandler,
    ProviderError,
    SessionError,
    ToolInvocation,
    define_tool,
)
from trimtab.providers import ModelRequest
from trimtab.testing import ScriptedModel, ScriptStep, tool_call

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SEED = "Reply with exactly FRESH_CONTEXT."
SYSTEM = "You are a helpful assistant."


class ClearArgs(BaseModel):
    prompt: str


class MultiplyArgs(BaseModel):
    a: int
    b: int


async def clear_context(params: ClearArgs, invocation: ToolInvocation) -> str:
    result = await invocation.session.history.clear_context(params.prompt)
    return f"Cleared {result.messages_cleared} messages."


TOOLS = [
    define_tool(
        "clear_context",
        description="Clear the conversation and start a fresh context window",
        params_type=ClearArgs,
        is_terminal=True,
        defer="never",
        handler=clear_context,
    ),
    define_tool(
        "multiply",
        description="Multiply two integers",
        params_type=MultiplyArgs,
        handler=lambda p: str(p.a * p.b),
    ),
]


async def sessions(store: Path) -> tuple[str, str]:
    """The demo sessions; returns the ids of the seed scenario and of a long session."""
    options = {
        "system_message": SYSTEM,
        "tools": TOOLS,
        "on_permission_request": PermissionHandler.approve_all,
    }
    async with Client(store=store) as client:
        arithmetic = await client.create_session(
            provider=ScriptedModel(
                [
                    tool_call("multiply", {"a": 17, "b": 23}),
                    "17 * 23 = 391.",
                    tool_call("multiply", {"a": 391, "b": 2}),
                    "391 * 2 = 782.",
                    "The user multiplied 17 by 23 (391), then doubled it (782).",
                    "Yes: 391.",
                ]
            ),
            **options,
        )
        await arithmetic.send_and_wait("What is 17 * 23?")
        await arithmetic.send_and_wait("And twice that?")
        await arithmetic.history.compact()
        await arithmetic.send_and_wait("So 17 * 23 was 391?")

        failing = await client.create_session(
            provider=ScriptedModel([ProviderError("rate_limit", "slow down", status_code=429)]),
            **options,
        )
        try:
            await failing.send_and_wait("Summarise the release notes.")
        except SessionError:
            pass

        calls = 0

        def reply(request: ModelRequest) -> ScriptStep:
            nonlocal calls
            calls += 1
            if calls % 60 == 0:
                return tool_call("clear_context", {"prompt": "Go on from the notes."})
            return "Noted." if calls % 20 == 0 else tool_call("multiply", {"a": calls, "b": 3})

        long = await client.create_session(provider=ScriptedModel(then=reply), **options)
        for _ in range(14):
            await long.send_and_wait("Work through the next items.")

        seeded = await client.create_session(
            provider=ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT"]),
            developer_messages=["Answer in one line."],
            **options,
        )
        await seeded.send_and_wait(f'Call clear_context with prompt "{SEED}" now.')
        return seeded.session_id, long.session_id


async def photograph(url: str, ids: tuple[str, str], out: Path) -> list[Path]:
    from playwright.async_api import async_playwright

    printed, url = url, url.split("?")[0]  # the printed URL carries the token (spec L9)
    session, long = (f"{url}sessions/{quote(i, safe='')}" for i in ids)
    shots = [
        ("inspector-sessions.png", url, 480),
        ("inspector-session.png", session, 1300),
        ("inspector-window.png", f"{session}/calls/2", 560),
        ("inspector-long-session.png", long, 700),
    ]
    written = []
    with tempfile.TemporaryDirectory() as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=FLAGS
            )
            page = await context.new_page()
            await page.goto(printed)  # its token traded for the cookie of the pages below
            for name, address, height in shots:
                await page.set_viewport_size({"width": 1200, "height": height})
                await page.goto(address)
                path = out / name
                await page.screenshot(path=str(path))
                written.append(path)
            await context.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        store = Path(work) / "sessions.db"
        ids = asyncio.run(sessions(store))
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        inspector = subprocess.Popen(
            [sys.executable, "-m", "trimtab", "inspect", "--store", str(store)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert inspector.stdout is not None
            url = inspector.stdout.readline().split(" at ", 1)[1].strip()
            for path in asyncio.run(photograph(url, ids, args.out)):
                print(f"{path} ({path.stat().st_size // 1024} KB)")
        finally:
            inspector.terminate()
            inspector.wait(timeout=30)


if __name__ == "__main__":
    main()
