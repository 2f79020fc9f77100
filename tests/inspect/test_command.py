"""Issue 19: `trimtab inspect` as a person runs it, a real process serving real HTTP, over
SQLite and PostgreSQL; and its live view, Server-Sent Events fed by the store's subscribe."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2 as httpx
import pytest

from tests.inspect.conftest import require_extra, seed_scenario
from trimtab import Client, PermissionHandler
from trimtab.testing import ScriptedModel

require_extra()

from trimtab.inspect import inspector_url  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
WEB_STACK = ("starlette", "uvicorn", "jinja2")


def environment(tmp_path: Path, home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMTAB_")}
    env["TRIMTAB_HOME"] = str(home or tmp_path / "home")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def run(tmp_path: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = ["-c", code, *args] if code else ["-m", "trimtab", *args]
    return subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        env=environment(tmp_path),
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


@contextmanager
def inspector_process(
    tmp_path: Path, *args: str, home: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`trimtab inspect ARGS` running (its TRIMTAB_HOME `home`, else in `tmp_path`), and the
    URL it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "trimtab", "inspect", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environment(tmp_path, home),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # ends at the first line, or when the process exits
        prefix = "inspecting sessions at "
        assert line.startswith(prefix), (line, process.stderr.read() if process.stderr else "")
        yield line.removeprefix(prefix).strip(), process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def base_of(url: str) -> str:
    """The inspector's root: the printed URL without the token it carries."""
    return url.split("?")[0]


@asynccontextmanager
async def admitted(url: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """An HTTP client that opened the printed `url` as a browser does, keeping the cookie
    the token was traded for (spec L9), and the inspector's root (also its base URL)."""
    async with httpx.AsyncClient(base_url=base_of(url), timeout=30) as http:
        opened = await http.get(url)
        assert opened.status_code == 303 and http.cookies, opened.text
        yield http, base_of(url)


async def seeded_store(tmp_path: Path, store: str | None = None) -> tuple[str, str]:
    """A store (a SQLite file unless given) holding the seed scenario; its spec and the id."""
    spec = store or str(tmp_path / "sessions.db")
    async with Client(store=spec) as client:
        session, _ = await seed_scenario(client)
    return spec, session.session_id


def session_url(base: str, session_id: str, rest: str = "") -> str:
    return f"{base}sessions/{quote(session_id, safe='')}{rest}"


def test_issue19_inspect_refuses_other_addresses_without_a_token(tmp_path: Path) -> None:
    store = tmp_path / "none.db"
    for token in ([], ["--token", ""]):
        result = run(tmp_path, "inspect", "--host", "0.0.0.0", "--store", str(store), *token)
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            "error: refusing to listen on '0.0.0.0' without a token: anyone who can reach it"
            " could read your sessions (pass --token, or use 127.0.0.1)",
            "hint: see 'trimtab inspect --help'",
        ]


def test_issue19_inspect_reports_a_missing_store_and_creates_none(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"

    result = run(tmp_path, "inspect", "--store", str(missing))

    assert result.returncode == 1
    assert result.stderr.startswith(f"error: there is no session store at {missing}\n")
    assert not missing.exists() and not (tmp_path / "home").exists()


def test_issue19_without_the_extra_the_error_names_the_install_command(tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['starlette'] = None\n"
        "from trimtab.cli import main\nsys.exit(main())"
    )

    result = run(tmp_path, "inspect", code=code)

    checkout = SRC.parent
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: the inspector needs the inspect extra (starlette is missing)",
        f"hint: install it with pip install -e '{checkout}[inspect]'",
    ]


def test_issue19_the_web_stack_is_loaded_only_by_the_inspector(tmp_path: Path) -> None:
    code = (
        "import sys, trimtab, trimtab.cli.app\n"
        f"print(sorted(set({WEB_STACK!r}) & set(sys.modules)))"
    )

    result = run(tmp_path, code=code)
    help_text = run(tmp_path, "inspect", "--help")

    assert result.stdout.strip() == "[]", result.stderr
    assert help_text.returncode == 0 and "--token TOKEN" in help_text.stdout


def test_issue19_the_printed_url_reaches_the_inspector_from_this_machine() -> None:
    assert inspector_url("127.0.0.1", 8080, None) == "http://127.0.0.1:8080/"
    assert inspector_url("0.0.0.0", 8080, "a b&c") == "http://127.0.0.1:8080/?token=a%20b%26c"
    assert inspector_url("::", 81, None) == "http://[::1]:81/"
    assert inspector_url("::1", 81, None) == "http://[::1]:81/"


async def test_issue19_inspect_prints_its_url_and_serves_a_sqlite_store(tmp_path: Path) -> None:
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store) as (url, _):
        async with admitted(url) as (http, base):
            index = await http.get(base)
            page = await http.get(session_url(base, session_id))
            window = await http.get(session_url(base, session_id, "/calls/2"))
            rebinding = await http.get(url, headers={"host": "attacker.example"})

    assert base.startswith("http://127.0.0.1:") and base.endswith("/")
    assert url.startswith(f"{base}?token=")
    assert index.status_code == 200 and f'href="/sessions/{session_id}"' in index.text
    assert page.status_code == 200 and "context cleared: 2 messages" in page.text
    assert window.status_code == 200 and 'class="msg msg-user seed"' in window.text
    assert rebinding.status_code == 421


async def test_issue19_a_token_is_traded_for_a_cookie(tmp_path: Path) -> None:
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store, "--token", "s3cret") as (url, _):
        base = url.split("?")[0]
        async with httpx.AsyncClient(timeout=30) as http:
            refused = await http.get(base)
            wrong = await http.get(f"{base}?token=guess")
            admitted = await http.get(session_url(f"{base}", session_id, "?page=1&token=s3cret"))
            cookie = admitted.headers["set-cookie"]
            with_cookie = await http.get(base, headers={"cookie": cookie.split(";")[0]})
            bearer = await http.get(base, headers={"authorization": "Bearer s3cret"})

    assert url == f"{base}?token=s3cret"
    assert refused.status_code == 401 and wrong.status_code == 401
    assert "open the URL that 'trimtab inspect' printed" in refused.text
    assert admitted.status_code == 303
    assert admitted.headers["location"] == f"/sessions/{session_id}?page=1"
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert with_cookie.status_code == 200 and session_id in with_cookie.text
    assert bearer.status_code == 200


async def test_issue19_inspect_serves_a_postgresql_store(tmp_path: Path, pg_dsn: str) -> None:
    store, session_id = await seeded_store(tmp_path, pg_dsn)
    with inspector_process(tmp_path, "--store", store) as (url, _):
        async with admitted(url) as (http, base):
            index = await http.get(base)
            page = await http.get(session_url(base, session_id))

    assert f'href="/sessions/{session_id}"' in index.text
    assert 'data-epoch="1"' in page.text and "seeded run after the clear" in page.text


class Stream:
    """The Server-Sent Events of one live view, read as they arrive."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines

    async def next(self, timeout: float = 30) -> dict[str, Any]:
        """The next message: its fields (`event`, `id`, `data` parsed)."""
        message: dict[str, Any] = {}
        async with asyncio.timeout(timeout):
            async for line in self._lines:
                if not line:
                    if "event" in message:
                        return message
                    message = {}
                    continue
                name, _, value = line.partition(": ")
                message[name] = json.loads(value) if name == "data" else value
        raise AssertionError("the stream ended")


@asynccontextmanager
async def live(
    http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
) -> AsyncIterator[Stream]:
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Stream(response.aiter_lines())


async def test_issue19_live_view_receives_events_appended_by_another_process(
    tmp_path: Path,
) -> None:
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store) as (url, _):
        async with admitted(url) as (http, base):
            stream_url = session_url(base, session_id, "/live?after=16")
            async with live(http, stream_url) as stream:
                # A later run, by a runtime that shares nothing with the inspector but the file.
                async with Client(store=store) as client:
                    session = await client.resume_session(
                        session_id,
                        provider=ScriptedModel(["LATER"]),
                        on_permission_request=PermissionHandler.approve_all,
                    )
                    await session.send_and_wait("And now?")
                    await session.disconnect()
                seen = [await stream.next() for _ in range(6)]
            async with live(http, stream_url, {"last-event-id": "18"}) as resumed:
                after_reconnect = await resumed.next()

    assert [(m["event"], m.get("id"), m["data"]["type"]) for m in seen] == [
        ("event", "17", "session.resume"),
        ("event", "18", "user.message"),
        ("event", "19", "assistant.turn_start"),
        ("event", "20", "assistant.message"),
        ("event", "21", "assistant.usage"),
        ("event", "22", "assistant.turn_end"),
    ]
    assert seen[1]["data"]["detail"] == "And now?" and seen[1]["data"]["epoch"] == 1
    assert seen[3]["data"]["detail"] == "LATER"
    assert (after_reconnect.get("id"), after_reconnect["data"]["type"]) == (
        "19",
        "assistant.turn_start",
    )


async def test_issue19_live_view_says_when_the_session_is_deleted(tmp_path: Path) -> None:
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store) as (url, _):
        async with admitted(url) as (http, base):
            bad = await http.get(session_url(base, session_id, "/live?after=-1"))
            async with live(http, session_url(base, session_id, "/live?after=16")) as stream:
                async with Client(store=store) as client:
                    await client.delete_session(session_id)
                ending = await stream.next()
            missing = await http.get(session_url(base, session_id, "/live"))

    assert bad.status_code == 400
    assert ending["event"] == "gone"
    assert missing.status_code == 404


async def test_issue19_live_views_end_when_the_inspector_stops(tmp_path: Path) -> None:
    """`trimtab.inspect.serve` stops on cancellation as on a signal: live views get `end`."""
    from trimtab.inspect import serve

    store, session_id = await seeded_store(tmp_path)
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(store, home=tmp_path, on_ready=ready.set_result))
    url = await asyncio.wait_for(ready, 30)
    async with admitted(url) as (http, base):
        async with live(http, session_url(base, session_id, "/live")) as stream:
            first = await stream.next()
            server.cancel()
            while (last := await stream.next())["event"] == "event":
                pass
            async with asyncio.timeout(30):
                with pytest.raises(asyncio.CancelledError):
                    await server
    assert first["data"]["type"] == "session.start"
    assert last["event"] == "end"


async def test_issue19_live_views_are_kept_alive_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trimtab.inspect import app, serve

    monkeypatch.setattr(app, "LIVE_KEEPALIVE", 0.05)
    monkeypatch.setattr(app, "MAX_LIVE_STREAMS", 1)
    store, session_id = await seeded_store(tmp_path)
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve(store, home=tmp_path, on_ready=ready.set_result))
    try:
        url = await asyncio.wait_for(ready, 30)
        stream_url = session_url(base_of(url), session_id, "/live?after=16")
        async with admitted(url) as (http, _):
            async with http.stream("GET", stream_url) as response:
                lines = response.aiter_lines()
                async with asyncio.timeout(30):
                    while await anext(lines) != ": keepalive":
                        pass
                second = await http.get(stream_url)
            # The closed view frees its slot once the server sees the disconnection.
            statuses = []
            for _ in range(200):
                async with http.stream("GET", stream_url) as again:
                    statuses.append(again.status_code)
                if statuses[-1] == 200:
                    break
                await asyncio.sleep(0.05)
    finally:
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await server
    assert second.status_code == 503 and "too many live views" in second.text
    assert statuses[-1] == 200
