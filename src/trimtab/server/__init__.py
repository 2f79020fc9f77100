"""`trimtab serve`: the runtime over JSON-RPC, in the Copilot SDK's protocol.

Programs written against the GitHub Copilot SDK run on trimtab unchanged: point the official
client at `serve` (TCP) or let it spawn `trimtab serve --stdio`. The package is an adapter
(`options` holds a server's settings, `command` is its command line, `serving` composes the
server, `copilot` maps the protocol's methods onto `trimtab.Client` and `Session` calls, `hub`
shares open sessions between connections); it holds no domain logic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trimtab.server.options import ServerOptions

if TYPE_CHECKING:
    from trimtab.server.serving import ServeError, serve

__all__ = ["ServeError", "ServerOptions", "serve"]


def __getattr__(name: str) -> Any:
    # The server itself is imported when first asked for: the `trimtab` command line mounts
    # `trimtab serve` (its options, from this package) and must not pay for the server's
    # protocol models to answer `trimtab --help`.
    if name in ("ServeError", "serve"):
        from trimtab.server import serving

        return getattr(serving, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
