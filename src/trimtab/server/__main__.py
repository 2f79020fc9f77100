"""`python -m trimtab.server` and `trimtab serve`: run the Copilot-protocol server.

Both run `main`, so that flags, defaults and help are the same. Besides its own flags the
server accepts those the official Copilot clients add when they spawn a runtime
(`--headless`, `--no-auto-update`, `--log-level L`, `--auth-token-env NAME`,
`--no-auto-login`, `--session-idle-timeout N`, `--embedded-host`,
`--cli-login-sync-integration-id=ID`, and `--remote`), and ignores them, apart from
`--log-level`. Any other flag is a usage error (exit status 2).

Everything that can be checked before serving is: the flags, the `--provider` config and the
store (opened and read once). A failure there is one line on stderr and a non-zero exit
status (2 for bad usage, 1 for a store or provider that cannot be used); the server says
`listening on port N` only once it is ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import click

from trimtab.server import ServeError, serve

_LOG_LEVELS = {
    "none": logging.CRITICAL + 1,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "all": logging.DEBUG,
}

EXIT_ERROR, EXIT_USAGE = 1, 2

_COPILOT_FLAGS = (
    "--headless",
    "--no-auto-update",
    "--no-auto-login",
    "--remote",
    "--embedded-host",
)
"""Flags the official clients pass to a runtime they spawn; meaningless here."""
_COPILOT_OPTIONS = ("--auth-token-env", "--session-idle-timeout", "--cli-login-sync-integration-id")
"""Options (with a value) the official clients pass; ignored as well."""


def _provider_json(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        config = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise click.BadParameter('expected a JSON object, such as {"type": "openai"}')
    return config


_positive = click.FloatRange(min=0, min_open=True)


def _command(function: Any) -> click.Command:
    options = [
        click.option(
            "--host",
            metavar="ADDRESS",
            default="127.0.0.1",
            show_default=True,
            help="Address to listen on (TCP). Any but loopback needs a token.",
        ),
        click.option(
            "--port",
            metavar="PORT",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help="TCP port; 0 picks a free one.",
        ),
        click.option("--stdio", is_flag=True, help="Speak on stdin and stdout instead of TCP."),
        click.option(
            "--store",
            metavar="PATH|URL",
            help="Session store: 'memory', a SQLite file, sqlite:///URL or postgresql://URL"
            " [env TRIMTAB_STORE; default: $TRIMTAB_HOME/trimtab.db].",
        ),
        click.option(
            "--token",
            metavar="TOKEN",
            help="Connection token clients must send in 'connect' [env"
            " COPILOT_CONNECTION_TOKEN]. Empty means none.",
        ),
        click.option(
            "--provider",
            metavar="JSON",
            callback=_provider_json,
            help='Provider of sessions that bring none, e.g. \'{"type": "openai"}\'. Only it'
            " gets API keys from this process's environment for a base URL it names.",
        ),
        click.option(
            "--lease-ttl",
            type=_positive,
            default=30.0,
            show_default=True,
            metavar="SECONDS",
            help="How long a crashed server's sessions stay locked before another server"
            " sharing the store takes them over.",
        ),
        click.option(
            "--store-timeout",
            type=_positive,
            default=30.0,
            show_default=True,
            metavar="SECONDS",
            help="Time within which every call of the store completes or fails: a run it"
            " holds up ends in an error, a request is answered with one.",
        ),
        click.option(
            "--max-connections",
            type=click.IntRange(min=1),
            default=4096,
            show_default=True,
            metavar="N",
            help="TCP connections served at once; more are refused with SERVER_BUSY.",
        ),
        click.option(
            "--max-output",
            type=click.IntRange(min=1),
            default=8 * 1024 * 1024,
            show_default=True,
            metavar="BYTES",
            help="Output a client may leave unread before it is disconnected.",
        ),
        click.option(
            "--connect-timeout",
            type=_positive,
            default=5.0,
            show_default=True,
            metavar="SECONDS",
            help="Time a TCP client has to send the token, when there is one.",
        ),
        click.option(
            "--idle-timeout",
            type=_positive,
            default=300.0,
            show_default=True,
            metavar="SECONDS",
            help="Time a TCP connection with no session and no request may stay open.",
        ),
        click.option(
            "--pending-timeout",
            type=_positive,
            default=120.0,
            show_default=True,
            metavar="SECONDS",
            help="Time the tool calls a dropped client left unanswered wait for a resuming one.",
        ),
        click.option(
            "--frame-timeout",
            type=_positive,
            default=10.0,
            show_default=True,
            metavar="SECONDS",
            help="Time a message's header may take once begun (and longest pause in its body).",
        ),
        click.option(
            "--log-level",
            type=click.Choice(list(_LOG_LEVELS)),
            metavar="LEVEL",
            default="warning",
            show_default=True,
            help="What goes to stderr: " + ", ".join(_LOG_LEVELS) + ".",
        ),
    ]
    options += [click.option(flag, is_flag=True, hidden=True) for flag in _COPILOT_FLAGS]
    options += [click.option(option, hidden=True) for option in _COPILOT_OPTIONS]
    for option in reversed(options):
        function = option(function)
    return click.command(
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
        help="Serve trimtab sessions to Copilot SDK clients over JSON-RPC (TCP, or --stdio).",
    )(function)


@_command
def _serve(**flags: Any) -> dict[str, Any]:
    return flags


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m trimtab.server") -> int:
    """Parse arguments, check the store and provider, serve until stopped; the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        flags = _serve.main(args=args, prog_name=prog, standalone_mode=False)
    except click.UsageError as exc:
        _fail(exc.format_message(), f"see '{prog} --help'")
        return EXIT_USAGE
    except click.Abort:
        return EXIT_ERROR
    if not isinstance(flags, dict):
        return int(flags or 0)  # --help was shown
    # The server runs on asyncio alone. httpcore2 imports trio, when it is installed, only to
    # tell which event loop it runs under, which costs a server ~4 MB for nothing: in this
    # process trio is marked absent (docs/performance.md, a long-running server's memory).
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]
    # The official clients log every stderr line as a warning: only trimtab's own records go
    # below WARNING, not those of the HTTP libraries under the providers.
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("trimtab").setLevel(_LOG_LEVELS[flags["log_level"]])
    token = flags["token"]
    if token is None and not flags["stdio"]:
        # What the official clients' `for_tcp` hands to the runtime they spawn.
        token = os.environ.get("COPILOT_CONNECTION_TOKEN")
    options: dict[str, Any] = {
        "host": flags["host"],
        "port": flags["port"],
        "stdio": flags["stdio"],
        "store": flags["store"],
        "token": token or None,
        "provider": flags["provider"],
        "lease_ttl": flags["lease_ttl"],
        "store_timeout": flags["store_timeout"],
        "max_connections": flags["max_connections"],
        "max_output": flags["max_output"],
        "connect_timeout": flags["connect_timeout"],
        "idle_timeout": flags["idle_timeout"],
        "frame_timeout": flags["frame_timeout"],
        "pending_timeout": flags["pending_timeout"],
    }
    try:
        asyncio.run(_run(options))
    except ValueError as exc:
        _fail(str(exc), f"see '{prog} --help'")
        return EXIT_USAGE
    except ServeError as exc:
        _fail(str(exc), "check --store and --provider (and that the database is reachable)")
        return EXIT_ERROR
    except KeyboardInterrupt:
        pass
    return 0


def _fail(message: str, hint: str) -> None:
    """The command line's error format: one line, then a hint (stderr)."""
    first = message.strip().splitlines()[0] if message.strip() else message
    print(f"error: {first}\nhint: {hint}", file=sys.stderr)


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
