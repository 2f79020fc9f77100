"""The `trimtab` commands: click wiring, each command a few lines that resolve the
configuration and hand over to the module doing the work.

Command bodies import their modules lazily so that `--help` and a mistyped flag answer fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from trimtab import __version__
from trimtab.server.command import serve_command

if TYPE_CHECKING:
    from trimtab.cli.config import Resolved

__all__ = ["cli"]

F = TypeVar("F", bound=Callable[..., Any])

_PROVIDER_HELP = (
    "openai, anthropic, ollama or local (the embedded model). Default: OPENAI_API_KEY, "
    "ANTHROPIC_API_KEY, a running Ollama, else local."
)


def _common_options(command: F) -> F:
    """Options every command takes."""
    command = click.option(
        "--store",
        metavar="PATH",
        help="Session store: a SQLite file, sqlite:///URL or 'memory' [env TRIMTAB_STORE].",
    )(command)
    return click.option(
        "--debug",
        is_flag=True,
        default=None,
        help="Show tracebacks of unexpected errors [env TRIMTAB_DEBUG].",
    )(command)


def _provider_options(command: F) -> F:
    """Options that choose the model and its tools."""
    options = [
        click.option("--provider", "-p", metavar="NAME", help=_PROVIDER_HELP),
        click.option("--model", "-m", metavar="NAME", help="Model name [env TRIMTAB_MODEL]."),
        click.option("--base-url", metavar="URL", help="API root of an OpenAI-compatible server."),
        click.option("--api-key", metavar="KEY", help="API key [env TRIMTAB_API_KEY]."),
        click.option(
            "--tools",
            metavar="SET",
            help="'builtin': view, create, edit, bash, grep and glob in the current directory;"
            " 'demo': calculator, current_time and clear_context; 'none' (default).",
        ),
        click.option(
            "--system", "system_message", metavar="TEXT", help="System message of new sessions."
        ),
        click.option(
            "--timeout",
            metavar="SECONDS",
            type=float,
            help="Fail a model call that waits this long for data (default: 120 streamed, "
            "300 unstreamed) [env TRIMTAB_TIMEOUT].",
        ),
        click.option(
            "--max-turns",
            metavar="N",
            type=int,
            help="Model calls one run may make before it stops with an error (default 100)"
            " [env TRIMTAB_MAX_TURNS].",
        ),
        click.option(
            "--mcp",
            "mcp",
            metavar="NAME=COMMAND",
            multiple=True,
            help="An MCP server whose tools the session gets, started as COMMAND (repeatable); "
            "also the [mcp_servers] table of trimtab.toml.",
        ),
        # The scripted provider is a testing aid: replies from a JSON or YAML file.
        click.option("--script", metavar="FILE", hidden=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _resolve(settings: dict[str, Any]) -> Resolved:
    from trimtab.cli.config import mcp_flags, resolve

    if "mcp" in settings:
        settings["mcp_servers"] = mcp_flags(settings.pop("mcp"))
    return resolve(settings)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trimtab")
def cli() -> None:
    """trimtab: agent sessions from the command line.

    \b
    Examples:
      trimtab chat --tools demo
      trimtab run --tools demo --yes "What is 17 * 23?"
      trimtab sessions list

    Settings come from flags, TRIMTAB_* environment variables and an optional trimtab.toml
    (current directory, else $TRIMTAB_HOME); 'trimtab config' shows the values in force.
    """


@cli.command()
@click.argument("prompt", required=False)
@click.option("--yes", "-y", is_flag=True, help="Approve every tool call.")
@click.option("--json", "as_json", is_flag=True, help="Print every event as one JSON line.")
@click.option(
    "--output-schema",
    metavar="FILE",
    help="A JSON Schema file: the run ends with a result that follows it, printed as JSON.",
)
@_provider_options
@_common_options
def run(
    prompt: str | None, yes: bool, as_json: bool, output_schema: str | None, **settings: Any
) -> int:
    """Run one prompt in a new session and print the reply.

    PROMPT '-' or none reads the prompt from stdin. Exits 1 if the run ends in an error.
    Without --yes, tool calls are asked about on a terminal and denied otherwise.
    """
    from trimtab.cli.commands import run_once

    resolved = _resolve(settings)
    return run_once(resolved, prompt, yes=yes, as_json=as_json, output_schema=output_schema)


@cli.command()
@click.option(
    "--resume",
    "-r",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ID]",
    help="Continue the last session, or the one whose id starts with ID.",
)
@click.option("--yes", "-y", is_flag=True, help="Approve every tool call.")
@_provider_options
@_common_options
def chat(resume: str | None, yes: bool, **settings: Any) -> int:
    """Talk with an agent; type /help for the commands."""
    from trimtab.cli.chat import run_chat

    return run_chat(_resolve(settings), resume=resume, yes=yes)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_provider_options
@_common_options
def config(as_json: bool, **settings: Any) -> int:
    """Show the settings in force and the provider they select.

    Each setting is listed with where its value comes from: a flag, a TRIMTAB_* variable,
    the trimtab.toml file, or the default.
    """
    from trimtab.cli.commands import show_config

    return show_config(_resolve(settings), as_json=as_json)


# The server owns its command: its flags are `trimtab.server.ServerOptions`'s.
cli.add_command(serve_command)


@cli.command("worker")
@click.option(
    "--engine",
    metavar="URL",
    required=True,
    envvar="TRIMTAB_ENGINE",
    help="The engine whose runs to execute: temporal://HOST:PORT[/NAMESPACE] [env TRIMTAB_ENGINE].",
)
@click.option(
    "--store",
    metavar="PATH|URL",
    envvar="TRIMTAB_STORE",
    help="The sessions' store, the one their clients use (postgresql://..., or a SQLite file"
    " shared on this host) [env TRIMTAB_STORE].",
)
@click.option(
    "--tools",
    "tools",
    metavar="MODULE:ATTRIBUTE",
    multiple=True,
    help="A Tool, or a list of them, this worker runs (repeatable); a session's other tools"
    " are answered by a process that has it open.",
)
@click.option(
    "--provider",
    metavar="NAME|JSON",
    help="Provider of sessions whose log names none: openai, anthropic, ollama, local, or a"
    " JSON config. Only it gets API keys from the environment.",
)
@click.option("--task-queue", default="trimtab", show_default=True, metavar="NAME")
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the lease of a session this worker runs lasts without renewal.",
)
@click.option(
    "--max-runs",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    metavar="N",
    help="Runs this worker executes at once.",
)
@click.option(
    "--log-level",
    type=click.Choice(["error", "warning", "info", "debug"], case_sensitive=False),
    default="warning",
    show_default=True,
)
def worker(
    engine: str,
    store: str | None,
    tools: tuple[str, ...],
    provider: str | None,
    task_queue: str,
    lease_ttl: float,
    max_runs: int,
    log_level: str,
) -> int:
    """Run sessions' runs for a durable execution engine (needs the temporal extra).

    Clients started with the same engine (trimtab serve --engine, Client(engine=...)) store
    inputs and follow the logs; workers run the loop. A run whose worker dies or stalls goes
    on in another one.
    """
    import logging

    from trimtab.cli.errors import EXIT_USAGE, CliError
    from trimtab.cli.worker import run_worker
    from trimtab.server.options import provider_argument

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("trimtab").setLevel(log_level.upper())
    try:
        config = provider_argument(provider) if provider else None
    except ValueError as exc:
        raise CliError(f"--provider: {exc}", exit_code=EXIT_USAGE) from None
    return run_worker(
        engine=engine,
        store=store,
        tools=tools,
        provider=config,
        task_queue=task_queue,
        lease_ttl=lease_ttl,
        max_runs=max_runs,
    )


@cli.command("inspect")
@click.option(
    "--host",
    metavar="ADDRESS",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Any but loopback needs --token.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="TCP port; 0 picks a free one.",
)
@click.option(
    "--token",
    metavar="TOKEN",
    envvar="TRIMTAB_INSPECT_TOKEN",
    help="Token a browser must present; the printed URL carries it [env"
    " TRIMTAB_INSPECT_TOKEN]. Without one, the inspector makes one and also keeps it in"
    " $TRIMTAB_HOME/inspect/PORT.token (readable only by you). On the command line it shows"
    " in the process list: prefer the variable.",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Ask no token (loopback only): every account of this machine can then read every session.",
)
@_common_options
def inspect_sessions(
    host: str, port: int, token: str | None, no_auth: bool, **settings: Any
) -> int:
    """Serve a read-only web page to inspect the stored sessions.

    Runs, tool calls, context operations, the window the model saw at each call, token usage,
    and a live view of a running session. Prints the URL to open, which carries the token
    every request needs; Ctrl-C stops it. Needs the inspect extra.
    """
    from trimtab.cli.inspector import run_inspector

    return run_inspector(_resolve(settings), host=host, port=port, token=token, no_auth=no_auth)


@cli.group()
def sessions() -> None:
    """List, inspect, prune and delete stored sessions."""


@sessions.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@_common_options
def sessions_list(as_json: bool, **settings: Any) -> int:
    """List sessions, most recently active first."""
    from trimtab.cli.sessions import list_sessions

    return list_sessions(_resolve(settings), as_json=as_json)


@sessions.command("show")
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_common_options
def sessions_show(session_id: str, as_json: bool, **settings: Any) -> int:
    """Show one session: configuration, size, usage. ID may be a unique prefix."""
    from trimtab.cli.sessions import show_session

    return show_session(_resolve(settings), session_id, as_json=as_json)


@sessions.command("events")
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (wire shape).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@_common_options
def sessions_events(session_id: str, as_json: bool, follow: bool, **settings: Any) -> int:
    """Print a session's event log. ID may be a unique prefix."""
    from trimtab.cli.sessions import session_events

    return session_events(_resolve(settings), session_id, as_json=as_json, follow=follow)


@sessions.command("rm")
@click.argument("session_ids", metavar="ID...", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Delete even a session another process has open.")
@_common_options
def sessions_rm(session_ids: tuple[str, ...], force: bool, **settings: Any) -> int:
    """Delete sessions and their logs."""
    from trimtab.cli.sessions import remove_sessions

    return remove_sessions(_resolve(settings), session_ids, force=force)


@sessions.command("prune")
@click.argument("session_ids", metavar="[ID...]", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Prune every session not in use.")
@_common_options
def sessions_prune(session_ids: tuple[str, ...], every: bool, **settings: Any) -> int:
    """Drop the events before each session's context window from the store.

    The session's identity, configuration, usage and the marks of its earlier windows stay
    (in one `session.pruned` event), and so does everything its window needs: it resumes as
    before, but its earlier events are gone. A session in use by a process is refused (with
    --all, skipped). ID may be a unique prefix.
    """
    from trimtab.cli.sessions import prune_sessions

    return prune_sessions(_resolve(settings), session_ids, every=every)
