"""The inspector's fixtures: sessions made by the real runtime on a real store, scripted at
the model boundary only, and the inspector's app over the same store."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.conftest import clear_tool, open_session
from tests.requirements import require_import
from tests.server.accounts import other_account, shared_directory  # noqa: F401 (fixtures)
from trimtab import Client, Session
from trimtab.store import Store, open_store
from trimtab.testing import ScriptedModel, tool_call


def require_extra() -> None:
    """Skip the calling test module without the `inspect` extra."""
    for module in ("starlette", "uvicorn", "jinja2"):
        require_import(module, "needs the trimtab[inspect] extra")


SEED = "Reply with exactly FRESH_CONTEXT."
ASK = f'Call clear_context with prompt "{SEED}" now.'


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A real store, shared by the runtime writing sessions and the inspector reading them."""
    opened = open_store("memory" if request.param == "memory" else tmp_path / "trimtab.db")
    yield opened
    await opened.close()


@pytest.fixture
async def client(store: Store) -> AsyncIterator[Client]:
    async with Client(store=store) as runtime:
        yield runtime


@pytest.fixture
async def inspector(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """The inspector's pages, requested through httpx's ASGI transport with its token."""
    from trimtab.inspect import create_app

    token = secrets.token_urlsafe(32)
    transport = httpx.ASGITransport(app=create_app(store, token=token))
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {token}"},
    ) as http:
        yield http


async def seed_scenario(client: Client) -> tuple[Session, ScriptedModel]:
    """The seed scenario: a terminal `clear_context` clears the context; the seeded run answers."""
    model = ScriptedModel([tool_call("clear_context", {"prompt": SEED}), "FRESH_CONTEXT"])
    session = await open_session(client, model, clear_tool(), developer_messages=["DEV"])
    reply = await session.send_and_wait(ASK)
    assert reply is not None and reply.data.content == "FRESH_CONTEXT"
    return session, model


def visible(html: str) -> str:
    """The page's text without its tags (still HTML-escaped), spaces collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())
