"""Issue 34: a session id is any non-empty string, and each opens its own pages (spec L8).

Sessions whose ids read as another session's pages (`victim/calls/1`, `victim/live`), as
encodings (`a%2Fb`, `~7E`) or as path steps (`..`, `.`) sit beside `victim`; the inspector
runs as `trimtab inspect` does (uvicorn decoding the paths), and every link it prints, on the
list and on the pages, is followed as a browser would."""

from __future__ import annotations

import html
import re
from pathlib import Path

import httpx2 as httpx

from tests.inspect.conftest import require_extra
from tests.inspect.test_command import admitted, inspector_process, live
from trimtab import Client, PermissionHandler
from trimtab.testing import ScriptedModel

require_extra()

from trimtab.inspect.app import session_id_of, session_segment  # noqa: E402

IDS = [
    "victim",
    "victim/calls/1",
    "victim/live",
    "victim/events/2",
    "a%2Fb",
    "a/b",
    "..",
    ".",
    "../victim",
    "a b?c#d&e=f",
    "~7E",
    "naïve €",
    "x" * 200,
]


def message(index: int) -> str:
    return f"[first message of session {index}]"


def hrefs(page: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'href="([^"]+)"', page)]


def test_l8_session_segments_round_trip_and_hold_no_path_step() -> None:
    for session_id in IDS:
        segment = session_segment(session_id)
        assert session_id_of(segment) == session_id
        assert re.fullmatch(r"[A-Za-z0-9_~-]+", segment), segment  # no `/`, `%`, `.`
    assert session_segment("9f1c-uuid_like") == "9f1c-uuid_like"  # plain ids read as they are
    assert session_id_of("~zz") is None and session_id_of("~C3") is None


async def test_l8_every_session_id_opens_its_own_pages(tmp_path: Path) -> None:
    store = str(tmp_path / "sessions.db")
    async with Client(store=store) as client:
        sessions = []
        for index, session_id in enumerate(IDS):
            session = await client.create_session(
                session_id=session_id,
                provider=ScriptedModel(["ok", "again"]),
                on_permission_request=PermissionHandler.approve_all,
            )
            await session.send_and_wait(message(index))
            sessions.append(session)

        with inspector_process(tmp_path, "--store", store) as (url, _):
            async with admitted(url) as (http, _):
                index_page = (await http.get("/")).text
                for index, session_id in enumerate(IDS):
                    # The list's link to this session opens this session's page.
                    name = re.escape(html.escape(session_id))
                    [link] = re.findall(rf'<a class="mono" href="([^"]+)">{name}</a>', index_page)
                    page = await http.get(html.unescape(link))
                    assert page.status_code == 200, (session_id, page.text[:300])
                    assert html.escape(message(index)) in page.text, session_id
                    others = [message(i) for i in range(len(IDS)) if i != index]
                    assert not any(html.escape(m) in page.text for m in others), session_id

                    # Its window and event links open this session's window and events.
                    [window] = {h for h in hrefs(page.text) if h.endswith("/calls/1")}
                    window_page = await http.get(window)
                    assert window_page.status_code == 200, session_id
                    assert html.escape(message(index)) in window_page.text
                    assert f">{html.escape(session_id)}</a>" in window_page.text
                    events = [h for h in hrefs(page.text) if re.search(r"/events/\d+$", h)]
                    contents = [(await http.get(h)).json()["data"].get("content") for h in events]
                    assert message(index) in contents, session_id

                    # Its live view follows this session.
                    followed = (await http.get(html.unescape(link) + "?live=1")).text
                    [stream] = re.findall(r'data-stream="([^"]+)"', followed)
                    async with live(http, html.unescape(stream)) as events_stream:
                        await sessions[index].send_and_wait(f"{message(index)} again")
                        first = await events_stream.next()
                    assert first["data"]["detail"] == f"{message(index)} again", session_id


async def test_l8_a_segment_that_names_no_session_is_not_found(
    client: Client, inspector: httpx.AsyncClient
) -> None:
    session = await client.create_session(
        session_id="victim",
        provider=ScriptedModel(["ok"]),
        on_permission_request=PermissionHandler.approve_all,
    )
    await session.send_and_wait("hello")
    assert (await inspector.get("/sessions/victim")).status_code == 200
    assert (await inspector.get("/sessions/victim/calls/1")).status_code == 200
    for path in ("/sessions/~zz", "/sessions/~C3", "/sessions/victim~2Fcalls/calls/1"):
        response = await inspector.get(path)
        assert response.status_code == 404, path
