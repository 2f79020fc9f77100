"""The inspector's ASGI app: read-only pages over a `Store`, rendered on the server.

    /                                  the sessions (?q= searches ids and first messages)
    /sessions/{id}                     one session: usage chart, epochs, timeline (?page=N);
                                       ?live=1 follows it
    /sessions/{id}/calls/{n}           the window model call n saw, and what came before it
    /sessions/{id}/events/{seq}        one event as JSON
    /sessions/{id}/live?after=N        the events after the N-th, as Server-Sent Events

`{id}` is the session id as one path segment (`session_segment`): a session id is any
non-empty string, `/`, `?`, `%` and `..` included, and percent-encoding cannot carry every
such id in a path (servers decode `%2F` before routing, and browsers resolve `%2E%2E` as
`..`), so every character but ASCII letters, digits, `-` and `_` is written `~XX`, a byte of
its UTF-8 each (`a/b` is `a~2Fb`). Each id opens its own pages, whatever it holds.

Every page is a Jinja2 template with autoescaping: log text (which a model, a tool or a client
wrote, and may be hostile) reaches the page only as escaped text. The pages carry a Content
Security Policy that allows the one script of the live view (by nonce) and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from trimtab import SessionNotFoundError, StoreUnavailableError
from trimtab.events import Event
from trimtab.inspect.chart import usage_chart
from trimtab.inspect.guard import Guard
from trimtab.inspect.logs import Logs
from trimtab.inspect.timeline import describe
from trimtab.inspect.windows import window_view
from trimtab.store import Store

__all__ = ["LIVE_KEEPALIVE", "MAX_LIVE_STREAMS", "create_app", "session_id_of", "session_segment"]

logger = logging.getLogger("trimtab.inspect")

SESSIONS_PER_PAGE = 50
ENTRIES_PER_PAGE = 100
"""Timeline entries (runs, model calls with their tool calls, operations) per page."""
MAX_LIVE_STREAMS = 64
"""Live views open at once; one more is refused (503) rather than queued."""
LIVE_KEEPALIVE = 15.0
"""Seconds of silence after which a live view gets a comment, so that a dead connection is
noticed and a proxy does not close a live one."""
_LIVE_BUFFER = 256
"""Events read ahead for a live view whose browser is slow to take them."""
_QUIET = frozenset({"assistant.message_delta", "session.usage_info"})
"""Ephemeral events the live view leaves out: many, and none a person reads."""


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("trimtab.inspect", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        clip=lambda text, limit: text if len(text) <= limit else text[:limit],
        url=lambda value: quote(str(value), safe=""),
        segment=session_segment,
        when=_when,
        count=lambda number: f"{number:,}",
        times=lambda number, noun: f"{number:,} {noun}{'' if number == 1 else 's'}",
        pretty=_pretty,
        cost=_cost,
    )
    return env


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _cost(value: float) -> str:
    """A cost in the price table's unit: cents and below still show (spec U1)."""
    return f"{value:,.2f}" if value >= 100 else f"{value:,.4f}"


def _pretty(value: Any) -> str:
    """Tool arguments as a person reads them: JSON, indented; text as it is."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def create_app(
    store: Store,
    *,
    token: str | None,
    hosts: frozenset[str] | None = None,
    stopping: asyncio.Event | None = None,
) -> Guard:
    """The inspector over `store`, which the caller opens and closes.

    Args:
        store: Where the sessions are; only read.
        token: The token every request must carry (see `trimtab.inspect.guard`). None lets
            every request in: only for an app no one else reaches, which a loopback port is
            not (every account of the machine reaches it). Given explicitly either way.
        hosts: The host names requests may be addressed to (loopback without a token).
        stopping: Set it to end the live views: they never end by themselves, and an ASGI
            server waits for its open responses before it stops.
    """
    pages = _Pages(store, stopping or asyncio.Event())
    app = Starlette(
        routes=[
            Route("/", pages.index),
            # Browsers ask for it on every site: no icon, and no error in their consoles.
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            Route("/sessions/{session_id:session}/calls/{call:count}", pages.window),
            Route("/sessions/{session_id:session}/events/{seq:count}", pages.event),
            Route("/sessions/{session_id:session}/live", pages.live),
            Route("/sessions/{session_id:session}", pages.session),
        ],
        exception_handlers={
            SessionNotFoundError: pages.not_found,
            StoreUnavailableError: pages.unavailable,
        },
    )
    return Guard(app, token=token, hosts=hosts)


class _Pages:
    def __init__(self, store: Store, stopping: asyncio.Event) -> None:
        self.store = store
        self.stopping = stopping
        self.logs = Logs(store)
        self.env = _environment()
        self.streams = 0

    def render(self, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)
        html = self.env.get_template(name).render(nonce=nonce, **context)
        policy = (
            f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}';"
            " connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self';"
            " frame-ancestors 'none'"
        )
        headers = {
            "content-security-policy": policy,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
            "cache-control": "no-store",
        }
        return HTMLResponse(html, code, headers=headers)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        session_id = request.path_params.get("session_id", "")
        self.logs.forget(session_id)
        return self.render("error.html", 404, message=f"there is no session {session_id!r}")

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        return self.render("error.html", 503, message=f"the session store is unavailable: {exc}")

    async def index(self, request: Request) -> Response:
        query = request.query_params.get("q", "").strip()
        records = await self.store.list_sessions()
        if query:
            folded = query.casefold()
            records = [
                r
                for r in records
                if folded in r.session_id.casefold() or folded in (r.summary or "").casefold()
            ]
        page, pages = _page(request, len(records), SESSIONS_PER_PAGE)
        shown = records[(page - 1) * SESSIONS_PER_PAGE : page * SESSIONS_PER_PAGE]
        rows = []
        for record in shown:
            try:
                summary = await self.logs.summary(record)
            except SessionNotFoundError:
                continue  # deleted since the listing
            rows.append((record, summary, summary.status(held=record.lease_owner is not None)))
        return self.render(
            "index.html", query=query, rows=rows, total=len(records), page=page, pages=pages
        )

    async def session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        record = await self.store.get(session_id)
        log = await self.logs.load(session_id)
        timeline = log.timeline
        summary = timeline.digest.summary()
        live = request.query_params.get("live") == "1"
        entries = timeline.entries
        page, pages = _page(request, len(entries), ENTRIES_PER_PAGE, last=live)
        start = (page - 1) * ENTRIES_PER_PAGE
        return self.render(
            "session.html",
            record=record,
            summary=summary,
            status=summary.status(held=record.lease_owner is not None),
            chart=usage_chart(timeline.usage, timeline.markers),
            segments=timeline.segments,
            entries=entries[start : start + ENTRIES_PER_PAGE],
            continued=timeline.run_before(start) if start else None,
            page=page,
            pages=pages,
            live=live,
            event_count=len(log.events),
        )

    async def window(self, request: Request) -> Response:
        session_id, call = request.path_params["session_id"], request.path_params["call"]
        record = await self.store.get(session_id)
        log = await self.logs.load(session_id)
        view = window_view(log.events, call) if call >= 1 else None
        if view is None:
            calls = log.timeline.digest.model_calls
            message = f"session {session_id!r} has {calls} model calls, not {call}"
            return self.render("error.html", 404, message=message)
        # (Numbered from the first call: a pruned log holds the last ones only, X8.)
        turn = next(turn for turn in log.timeline.turns if turn.number == call)
        index = next(i for i, entry in enumerate(log.timeline.entries) if entry is turn)
        return self.render(
            "window.html",
            record=record,
            view=view,
            turn=turn,
            calls=log.timeline.digest.model_calls,
            timeline_page=index // ENTRIES_PER_PAGE + 1,
        )

    async def event(self, request: Request) -> Response:
        session_id, seq = request.path_params["session_id"], request.path_params["seq"]
        log = await self.logs.load(session_id)
        if not 1 <= seq <= len(log.events):
            return JSONResponse({"error": f"no event {seq}"}, 404)
        event = log.events[seq - 1]
        return JSONResponse(
            event.model_dump(mode="json", by_alias=True),
            headers={"x-content-type-options": "nosniff", "cache-control": "no-store"},
        )

    async def live(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        await self.store.get(session_id)  # a 404 now rather than an empty stream
        given = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        after = _number(given)
        if after is None:
            return JSONResponse({"error": "after must be an event number"}, 400)
        if self.streams >= MAX_LIVE_STREAMS:
            return JSONResponse({"error": "too many live views open"}, 503)
        return StreamingResponse(
            self._stream(session_id, after),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def _stream(self, session_id: str, after: int) -> AsyncIterator[str]:
        """The session's events after the first `after`, as Server-Sent Events, until the
        browser goes away, the session is deleted or the inspector stops."""
        self.streams += 1
        queue: asyncio.Queue[Event | str] = asyncio.Queue(_LIVE_BUFFER)
        reader = asyncio.create_task(_follow(self.store, session_id, after, queue.put))
        stop = asyncio.create_task(self.stopping.wait())
        seq = after
        try:
            yield "retry: 2000\n\n"
            while True:
                item = await _next(queue, stop)
                if item is None:
                    yield ": keepalive\n\n"
                    continue
                if isinstance(item, str):
                    yield f"event: {item}\ndata: {{}}\n\n"
                    return
                if item.type in _QUIET:
                    continue
                if not item.ephemeral:
                    seq += 1
                yield _sse(item, None if item.ephemeral else seq)
        finally:
            self.streams -= 1
            reader.cancel()
            stop.cancel()


async def _next(queue: asyncio.Queue[Event | str], stop: asyncio.Task[Any]) -> Event | str | None:
    """The next item of a live view: an event, how it ended (`end` once `stop` is done), or
    None after `LIVE_KEEPALIVE` seconds without either."""
    getting = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait(
        {getting, stop}, timeout=LIVE_KEEPALIVE, return_when=asyncio.FIRST_COMPLETED
    )
    if getting in done:
        return getting.result()
    getting.cancel()
    return "end" if stop in done else None


async def _follow(
    store: Store, session_id: str, after: int, put: Callable[[Event | str], Awaitable[None]]
) -> None:
    """Hand the session's events to `put`, then how the subscription ended: `gone` (the
    session was deleted), `end` (the store closed) or `error`."""
    end = "end"
    try:
        async with aclosing(store.subscribe(session_id, after=after)) as events:
            async for event in events:
                await put(event)
    except SessionNotFoundError:
        end = "gone"
    except Exception:  # the store failed: the live view says so instead of hanging
        logger.exception("following session %s failed", session_id)
        end = "error"
    await put(end)


def _sse(event: Event, seq: int | None) -> str:
    data = {
        "seq": seq,
        "type": event.type,
        "time": event.timestamp.astimezone(UTC).strftime("%H:%M:%S"),
        "epoch": event.context_epoch,
        "detail": " ".join(describe(event).split())[:300],
    }
    # json.dumps escapes newlines, so the data is one line of the stream.
    return (
        f"id: {seq}\n" if seq is not None else ""
    ) + f"event: event\ndata: {json.dumps(data)}\n\n"


def _page(request: Request, items: int, size: int, *, last: bool = False) -> tuple[int, int]:
    """The page asked for (the last with `last`), within the pages there are."""
    pages = max(1, math.ceil(items / size))
    page = _number(request.query_params.get("page", ""))
    if page is None:
        page = pages if last else 1
    return min(max(page, 1), pages), pages


def _number(text: str) -> int | None:
    """`text` as a count, if it is one: ASCII digits (`isdigit` also takes "²" and "٣"), and
    not so many that `int` refuses them."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


class _Count(Convertor[int]):
    """A route's count, as `_number` reads one (Starlette's `int` takes any run of digits)."""

    regex = "[0-9]{1,18}"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(value)


register_url_convertor("count", _Count())

_SEGMENT_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_STRAY_TILDE = re.compile(r"~(?![0-9A-Fa-f]{2})")


def session_segment(session_id: str) -> str:
    """`session_id` as the one path segment of its pages' URLs (see the module's doc)."""
    return "".join(
        char if char in _SEGMENT_SAFE else "".join(f"~{byte:02X}" for byte in char.encode())
        for char in session_id
    )


def session_id_of(segment: str) -> str | None:
    """The session id a path segment names (`session_segment`'s inverse; characters not
    written `~XX` stand for themselves); None for a segment that names none."""
    if _STRAY_TILDE.search(segment):
        return None
    try:
        return unquote_to_bytes(segment.replace("%", "%25").replace("~", "%")).decode()
    except UnicodeDecodeError:
        return None


class _SessionSegment(Convertor[str]):
    """A session id in a route: one path segment, as `session_segment` writes it. One that
    names no session is kept as it came, so that it is not found."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        session_id = session_id_of(value)
        return value if session_id is None else session_id

    def to_string(self, value: str) -> str:
        return session_segment(value)


register_url_convertor("session", _SessionSegment())
