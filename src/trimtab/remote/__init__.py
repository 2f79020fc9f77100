"""The trimtab API over the wire: `Client.connect("tcp://...")` returns a `RemoteClient`.

An adapter beside `trimtab.server`: it drives a `trimtab serve` process with the same
Copilot-protocol JSON-RPC the official SDK clients speak, and offers the in-process API
(`create_session`, `send_and_wait`, `on`, `history.clear_context`, ...), with tools and the
permission handler running in the caller's process.
"""

from trimtab.remote._client import RemoteClient
from trimtab.remote._session import RemoteHistory, RemoteSession

__all__ = ["RemoteClient", "RemoteHistory", "RemoteSession"]
