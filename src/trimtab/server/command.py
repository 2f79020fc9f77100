"""`trimtab serve` and `python -m trimtab.server`: one click command, `serve_command`.

Its options are made from `ServerOptions`: a flag per field, named after it, with the field's
docstring as help and its default; the model validates the values, so that a field added to
it is a flag, checked, with nothing written twice. Besides them, `--log-level`, and the flags
the official Copilot SDKs add when they spawn a runtime (`SDK_FLAGS`): all accepted, so that
no SDK is locked out, and those that mean nothing here ignored. Any other flag is a usage
error.

Everything that can be checked before serving is: the flags, the provider (built once) and
the store (opened and read once). A failure there is one line on stderr and a non-zero exit
status (2 for bad usage, 1 for a store, provider or port that cannot be used); the server says
`listening on port N` only once it is ready (spec S4).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

import click
from click.core import ParameterSource
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from trimtab.server.options import Flag, ServerOptions

__all__ = [
    "EXIT_ERROR",
    "EXIT_USAGE",
    "SDK_FLAGS",
    "ServeFailed",
    "SdkFlag",
    "main",
    "serve_command",
]

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

LOG_LEVELS = {
    "none": logging.CRITICAL + 1,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "all": logging.DEBUG,
}
"""`--log-level`'s values: the official SDKs' names for them."""

ENGINE_VARIABLE = "TRIMTAB_ENGINE"
"""Where an operator names the engine of a server an SDK spawns (it passes no `--engine`)."""

TOKEN_VARIABLE = "COPILOT_CONNECTION_TOKEN"
"""Where the official SDKs put the connection token of a TCP runtime they spawn."""

BOUNDARY = (
    "A stdio client is the user who started the server: like the Copilot CLI, it may have"
    " the server run the MCP commands it names and read the files it attaches. A TCP client"
    " must present a token and drives sessions, nothing more: the commands it names run only"
    " as --allow-mcp-commands or --mcp-command allow, the files it attaches are read only"
    " under --attachments-root, the URLs it names are confined to --allowed-host when given,"
    " and with --tokens-file it sees only its own sessions."
)
"""The trust boundary of a server, in two sentences (`--help`, the README, spec S11)."""


@dataclass(frozen=True, slots=True)
class SdkFlag:
    """A flag an official SDK passes to the runtime it spawns, which means nothing here."""

    flag: str
    metavar: str | None
    """The placeholder of its value; None for a flag that takes none."""
    why: str
    """What it asks of the Copilot CLI, and why trimtab has nothing to do."""


SDK_FLAGS = (
    SdkFlag("--server", None, "Java, Rust: run as a server, which this command does"),
    SdkFlag("--headless", None, "Node, Python, Go, .NET: no terminal UI; there is none"),
    SdkFlag("--no-auto-update", None, "all six: do not update itself; trimtab never does"),
    SdkFlag("--no-auto-login", None, "do not sign in to GitHub; trimtab signs in to nothing"),
    SdkFlag("--remote", None, "sessions on github.com; trimtab's live in its store"),
    SdkFlag("--embedded-host", None, "the worker of an in-process host; this is a server"),
    SdkFlag("--auth-token-env", "NAME", "the variable holding a GitHub token; none is used"),
    SdkFlag(
        "--session-idle-timeout",
        "SECONDS",
        "the CLI's cleanup of idle sessions; trimtab's are a log, closed with their clients",
    ),
    SdkFlag("--cli-login-sync-integration-id", "ID", "GitHub sign-in sync; none is used"),
)
"""Every flag of the six official SDKs' spawn code (Node, Python, Go, .NET, Java, Rust) but
those honoured: `--stdio`, `--port N` (options of `ServerOptions`) and `--log-level L`."""


class ServeFailed(click.ClickException):
    """The server could not start for a reason other than its flags (exit status 1)."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _metavar(field: FieldInfo) -> str:
    for item in field.metadata:
        if isinstance(item, Flag):
            return item.metavar
    if get_origin(field.annotation) is Literal:
        return "[" + "|".join(map(str, get_args(field.annotation))) + "]"
    return "VALUE"


def _option(name: str, field: FieldInfo) -> click.Option:
    """The flag of one field of `ServerOptions`. Values reach the model as given (text), for
    it to convert and check; click only shows the default. A field that holds several values
    (an allow-list) is a flag given once per value."""
    default = field.get_default(call_default_factory=True)
    if field.annotation is bool:
        return click.Option([_flag(name)], is_flag=True, default=default, help=field.description)
    many = _holds_several(field.annotation)
    return click.Option(
        [_flag(name)],
        type=click.STRING,
        multiple=many,
        metavar=_metavar(field),
        required=field.is_required(),
        default=default,
        show_default=bool(default) if many else default is not None,
        help=field.description,
    )


def _holds_several(annotation: Any) -> bool:
    """Whether a field's type is a collection (or an optional one)."""
    if get_origin(annotation) in (Union, UnionType):
        return any(_holds_several(arg) for arg in get_args(annotation) if arg is not NoneType)
    return get_origin(annotation) in (list, tuple, set, frozenset)


def _sdk_option(flag: SdkFlag) -> click.Option:
    if flag.metavar is None:
        return click.Option([flag.flag], is_flag=True, hidden=True, expose_value=False)
    return click.Option([flag.flag], metavar=flag.metavar, hidden=True, expose_value=False)


def _options(ctx: click.Context, given: dict[str, Any]) -> ServerOptions:
    """The server's options from the flags given (not their defaults: those are the model's),
    and the token the official SDKs hand a TCP runtime in the environment."""
    values = {
        name: value
        for name, value in given.items()
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    }
    if "engine" not in values and os.environ.get(ENGINE_VARIABLE):
        values["engine"] = os.environ[ENGINE_VARIABLE]
    others = ("token", "stdio", "tokens_file", "no_auth")
    if not any(values.get(name) for name in others) and os.environ.get(TOKEN_VARIABLE):
        # A stdio client sends no token: one inherited in the environment would lock it out.
        values["token"] = os.environ[TOKEN_VARIABLE]
    try:
        return ServerOptions.model_validate(values)
    except ValidationError as exc:
        raise _usage_error(ctx, exc) from None


def _usage_error(ctx: click.Context, exc: ValidationError) -> click.UsageError:
    """The first problem of `exc`, worded as click words a bad value (and naming its flag)."""
    problem = exc.errors()[0]
    cause = problem.get("ctx", {}).get("error")
    message = str(cause) if isinstance(cause, ValueError) else problem["msg"]
    name, *inside = problem["loc"] or ("",)
    if inside:
        message = ".".join(map(str, inside)) + f": {message}"
    param = next((p for p in ctx.command.params if p.name == name), None)
    if param is None:
        return click.UsageError(message, ctx)
    return click.BadParameter(message, ctx, param)


def _serve(log_level: str, **given: Any) -> None:
    ctx = click.get_current_context()
    options = _options(ctx, given)
    # The server runs on asyncio alone. httpcore2 imports trio, when it is installed, only to
    # tell which event loop it runs under, which costs a server ~4 MB for nothing: in this
    # process trio is marked absent (docs/performance.md, a long-running server's memory).
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]
    # The official clients log every stderr line as a warning: only trimtab's own records go
    # below WARNING, not those of the HTTP libraries under the providers.
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("trimtab").setLevel(LOG_LEVELS[log_level.lower()])
    from trimtab.server.serving import ServeError

    try:
        asyncio.run(_run(options))
    except ValueError as exc:  # a provider config or store spec that cannot work
        raise click.UsageError(str(exc), ctx) from None
    except ServeError as exc:
        raise ServeFailed(str(exc), exc.hint) from None
    except KeyboardInterrupt:
        pass  # how a server in a terminal is stopped
    if options.engine is not None:
        # Stopped cleanly: end here, skipping the interpreter's teardown, during which the
        # Temporal SDK's threads may still call into Python and abort it (sdk-python#300).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


async def _run(options: ServerOptions) -> None:
    from trimtab.server.serving import serve

    task = asyncio.current_task()
    assert task is not None
    # SIGTERM stops the server like Ctrl-C: sessions are let go and their leases released.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await serve(options)
    except asyncio.CancelledError:
        pass


serve_command = click.Command(
    "serve",
    callback=_serve,
    params=[
        *(_option(name, field) for name, field in ServerOptions.model_fields.items()),
        click.Option(
            ["--log-level"],
            type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
            metavar="LEVEL",
            default="warning",
            show_default=True,
            help="What goes to stderr: " + ", ".join(LOG_LEVELS) + ".",
        ),
        *map(_sdk_option, SDK_FLAGS),
    ],
    help="Serve trimtab sessions to Copilot SDK clients over JSON-RPC (TCP, or --stdio).\n\n"
    + BOUNDARY,
    epilog="The flags the official Copilot SDKs add when they start a runtime (--headless,"
    " --server, --no-auto-update, --auth-token-env NAME, ...) are accepted; those that mean"
    " nothing here are ignored.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m trimtab.server") -> int:
    """Run `serve_command` as `prog`: parse, check, serve until stopped; the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        serve_command.main(args, prog_name=prog, standalone_mode=False)
    except click.UsageError as exc:
        _fail(exc.format_message(), f"see '{prog} --help'")
        return EXIT_USAGE
    except ServeFailed as exc:
        _fail(exc.format_message(), exc.hint)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:  # Ctrl-C before the server ran
        return EXIT_INTERRUPTED
    return 0


def _fail(message: str, hint: str) -> None:
    """The command line's error format: one line, then a hint (stderr)."""
    first = message.strip().splitlines()[0] if message.strip() else message
    print(f"error: {first}\nhint: {hint}", file=sys.stderr)
