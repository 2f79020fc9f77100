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

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

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


class _UsageError(Exception):
    """Bad flags, worded as the `trimtab` command line words them."""


class _Parser(argparse.ArgumentParser):
    # argparse rather than click (which the `trimtab` command uses): a long-running server
    # would carry click's ~1 MB for one parse (docs/performance.md, server RSS). Errors and
    # help read as click's, so that both entry points look alike.
    def error(self, message: str) -> NoReturn:
        found = re.fullmatch(r"argument (\S+): (.*)", message, re.DOTALL)
        if found is None:
            raise _UsageError(message)
        flag, reason = found.groups()
        if reason.startswith("expected one argument"):
            raise _UsageError(f"Option '{flag}' requires an argument.")
        raise _UsageError(f"Invalid value for '{flag}': {reason}")


class _Help(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, "Usage: ")


def _provider_json(value: str) -> Any:
    try:
        config = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, such as {"type": "openai"}')
    return config


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid float.") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value} is not in the range x>0.")
    return number


def _int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a valid integer.") from None
        if number < low or (high is not None and number > high):
            bounds = f"{low}<=x" + ("" if high is None else f"<={high}")
            raise argparse.ArgumentTypeError(f"{value} is not in the range {bounds}.")
        return number

    return parse


def _parser(prog: str) -> _Parser:
    parser = _Parser(
        prog=prog,
        usage="%(prog)s [OPTIONS]",
        description="Serve trimtab sessions to Copilot SDK clients over JSON-RPC"
        " (TCP, or --stdio).",
        formatter_class=_Help,
        add_help=False,
        allow_abbrev=False,
    )
    group = parser.add_argument_group("Options")

    def option(flag: str, *, default: Any = None, help: str, **kwargs: Any) -> None:
        shown = "" if default is None or default is False else f" [default: {default}]"
        group.add_argument(flag, default=default, help=help + shown, **kwargs)

    option(
        "--host",
        metavar="ADDRESS",
        default="127.0.0.1",
        help="Address to listen on (TCP). Any but loopback needs a token.",
    )
    option(
        "--port",
        metavar="PORT",
        type=_int_range(0, 65535),
        default=0,
        help="TCP port; 0 picks a free one.",
    )
    option(
        "--stdio",
        action="store_true",
        default=False,
        help="Speak on stdin and stdout instead of TCP.",
    )
    option(
        "--store",
        metavar="PATH|URL",
        help="Session store: 'memory', a SQLite file, sqlite:///URL or postgresql://URL"
        " [env TRIMTAB_STORE; default: $TRIMTAB_HOME/trimtab.db].",
    )
    option(
        "--token",
        metavar="TOKEN",
        help="Connection token clients must send in 'connect' [env"
        " COPILOT_CONNECTION_TOKEN]. Empty means none.",
    )
    option(
        "--provider",
        metavar="JSON",
        type=_provider_json,
        help='Provider of sessions that bring none, e.g. \'{"type": "openai"}\'. Only it'
        " gets API keys from this process's environment for a base URL it names.",
    )
    option(
        "--lease-ttl",
        metavar="SECONDS",
        type=_positive,
        default=30.0,
        help="How long a crashed server's sessions stay locked before another server"
        " sharing the store takes them over.",
    )
    option(
        "--store-timeout",
        metavar="SECONDS",
        type=_positive,
        default=30.0,
        help="Time within which every call of the store completes or fails: a run it"
        " holds up ends in an error, a request is answered with one.",
    )
    option(
        "--max-connections",
        metavar="N",
        type=_int_range(1),
        default=4096,
        help="TCP connections served at once; more are refused with SERVER_BUSY.",
    )
    option(
        "--max-output",
        metavar="BYTES",
        type=_int_range(1),
        default=8 * 1024 * 1024,
        help="Output a client may leave unread before it is disconnected.",
    )
    option(
        "--max-requests",
        metavar="N",
        type=_int_range(1),
        default=1000,
        help="Requests a client may have in flight; more are refused (-32004).",
    )
    option(
        "--connect-timeout",
        metavar="SECONDS",
        type=_positive,
        default=5.0,
        help="Time a TCP client has to send the token, when there is one.",
    )
    option(
        "--idle-timeout",
        metavar="SECONDS",
        type=_positive,
        default=300.0,
        help="Time a TCP connection with no session and no request may stay open.",
    )
    option(
        "--pending-timeout",
        metavar="SECONDS",
        type=_positive,
        default=120.0,
        help="Time the tool calls a dropped client left unanswered wait for a resuming one.",
    )
    option(
        "--frame-timeout",
        metavar="SECONDS",
        type=_positive,
        default=10.0,
        help="Time a message's header may take once begun (and longest pause in its body).",
    )
    option(
        "--log-level",
        metavar="LEVEL",
        choices=list(_LOG_LEVELS),
        default="warning",
        help="What goes to stderr: " + ", ".join(_LOG_LEVELS) + ".",
    )
    group.add_argument("-h", "--help", action="store_true", help="Show this message and exit.")
    for flag in _COPILOT_FLAGS:
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for name in _COPILOT_OPTIONS:
        parser.add_argument(name, help=argparse.SUPPRESS)
    return parser


def _flags(parser: _Parser, args: list[str]) -> argparse.Namespace:
    flags, extra = parser.parse_known_args(args)
    if extra:
        first = extra[0]
        if first.startswith("-"):
            raise _UsageError(f"No such option '{first.split('=', 1)[0]}'")
        raise _UsageError(f"Got unexpected extra argument ({first})")
    return flags


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m trimtab.server") -> int:
    """Parse arguments, check the store and provider, serve until stopped; the exit status."""
    parser = _parser(prog)
    try:
        parsed = _flags(parser, list(sys.argv[1:] if argv is None else argv))
    except _UsageError as exc:
        _fail(str(exc), f"see '{prog} --help'")
        return EXIT_USAGE
    if parsed.help:
        print(parser.format_help().rstrip("\n"))
        return 0
    flags = vars(parsed)
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
        "max_requests": flags["max_requests"],
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
