"""`python -m trimtab.server`: run the Copilot-protocol server.

Accepts the flags the official Copilot clients add when they spawn a runtime
(`--headless`, `--no-auto-update`, `--log-level L`, `--auth-token-env NAME`,
`--no-auto-login`, `--session-idle-timeout N`, `--remote`) and ignores them, apart from
`--log-level`. Any other unknown argument is reported on stderr and ignored too, so a newer
client's extra flags do not stop the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from trimtab.server import serve

_LOG_LEVELS = {
    "none": logging.CRITICAL + 1,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "all": logging.DEBUG,
}


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve trimtab sessions to Copilot SDK clients over JSON-RPC.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (TCP)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    parser.add_argument("--stdio", action="store_true", help="speak on stdin/stdout")
    parser.add_argument("--store", help="'memory', a SQLite path or URL (default: TRIMTAB_HOME)")
    parser.add_argument(
        "--token", help="connection token clients must send (default: $COPILOT_CONNECTION_TOKEN)"
    )
    parser.add_argument(
        "--provider", type=json.loads, help="JSON provider config for sessions that bring none"
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a crashed server's sessions stay locked before another takes them over",
    )
    parser.add_argument("--log-level", default="warning", choices=sorted(_LOG_LEVELS))
    # Flags the official clients pass to a runtime they spawn; meaningless here.
    for flag in ("--headless", "--no-auto-update", "--no-auto-login", "--remote"):
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for option in ("--auth-token-env", "--session-idle-timeout"):
        parser.add_argument(option, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m trimtab.server") -> int:
    """Parse arguments, serve until stopped; returns the exit status.

    `trimtab serve` can delegate here (`main(args, prog="trimtab serve")`), so that the
    flags, their defaults and the Copilot client flags it tolerates stay in one place.
    """
    args, unknown = _parser(prog).parse_known_args(argv)
    # The official clients log every stderr line as a warning: only trimtab's own records go
    # below WARNING, not those of the HTTP libraries under the providers.
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("trimtab").setLevel(_LOG_LEVELS[args.log_level])
    if unknown:
        logging.getLogger("trimtab.server").debug("ignoring arguments %s", unknown)
    token = args.token
    if token is None and not args.stdio:
        # What the official clients' `for_tcp` hands to the runtime they spawn.
        token = os.environ.get("COPILOT_CONNECTION_TOKEN") or None
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "stdio": args.stdio,
        "store": args.store,
        "token": token,
        "provider": args.provider,
        "lease_ttl": args.lease_ttl,
    }
    try:
        asyncio.run(_run(options))
    except ValueError as exc:
        print(f"trimtab serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def _run(options: dict[str, Any]) -> None:
    task = asyncio.current_task()
    assert task is not None
    # SIGTERM stops the server like Ctrl-C: sessions are let go and their leases released.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await serve(**options)
    except asyncio.CancelledError:
        pass


if __name__ == "__main__":
    sys.exit(main())
