"""`trimtab run` and `trimtab config`."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from trimtab.cli.config import Resolved
from trimtab.cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError, read_input
from trimtab.cli.host import SessionHost
from trimtab.cli.render import JsonRenderer, Terminal, TextRenderer, printable, table
from trimtab.cli.runtime import (
    ApprovalMode,
    Approver,
    Portal,
    TerminalBridge,
    provider_type,
    session_error_hint,
)
from trimtab.cli.select import choose_provider

__all__ = ["run_once", "show_config"]


def run_once(
    resolved: Resolved,
    prompt: str | None,
    *,
    yes: bool,
    as_json: bool,
    output_schema: str | None = None,
) -> int:
    """One prompt in a new session; the exit code is 1 if the run ended in `session.error`,
    or stopped because a tool call was rejected (spec O2).

    On stdout: the reply (streamed on a terminal, whole into a pipe), or with `as_json` every
    event as a JSON line; with `output_schema` (a JSON Schema file), the run's typed result
    as one line of JSON instead of the reply (spec OUT8). Tool calls and notices go to
    stderr.
    """
    term = Terminal.detect()
    schema = _schema(output_schema) if output_schema is not None else None
    text = _prompt(prompt)
    mode: ApprovalMode = "yes" if yes else "ask" if sys.stdin.isatty() else "deny"
    live = term.out.isatty()
    renderer = (
        JsonRenderer(term) if as_json else TextRenderer(term, replies=live, activity_to_err=True)
    )
    approver = Approver(term, mode, prompt_on_err=True)
    with Portal(term) as portal, SessionHost(portal, resolved, term) as host:
        bridge = TerminalBridge(portal, term, renderer.render, approver)
        session = host.create(bridge)
        provider = provider_type(session)
        if isinstance(renderer, TextRenderer) and provider == "local":
            renderer.first_wait = "loading the embedded model"
        if as_json:
            # session.start was logged before the bridge listened: print it from the log.
            for event in host.events(session.session_id):
                renderer.render(event)
        outcome = bridge.drive(text, output_schema=schema)
    if outcome.error is not None:
        error = outcome.error
        term.error(f"{error.error_type}: {error.message}", session_error_hint(error, provider))
        return EXIT_ERROR
    if outcome.aborted:
        return EXIT_INTERRUPTED
    if outcome.rejected is not None:
        # The run ends after a rejected call's batch (spec O2): no answer is coming.
        term.note(f"trimtab: the run stopped because the {outcome.rejected} call was rejected")
        return EXIT_ERROR
    if schema is not None:
        if outcome.output is None:  # (an abort, or a rejected call: reported above)
            return EXIT_ERROR
        if not as_json:  # (the events carry it: `output`)
            result = json.dumps(outcome.output.value, ensure_ascii=False)
            term.line(printable(result, json=True))
        return 0
    reply = outcome.reply.data.content if outcome.reply else ""
    if not as_json and not live and reply:
        term.line(printable(reply, keep="\n\t"))
    return 0


def _schema(path: str) -> dict[str, Any]:
    """The JSON Schema of `--output-schema`, checked before any session starts."""
    from trimtab._output import checked_schema

    try:
        with open(path, "rb") as file:
            text = read_input(file, f"--output-schema {path}")
    except OSError as exc:
        raise CliError(
            f"cannot read --output-schema {path}: {exc.strerror or exc}",
            hint="name a JSON Schema file",
            exit_code=EXIT_USAGE,
        ) from None
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise CliError(
            f"--output-schema {path} is not JSON: {exc}", hint="fix it", exit_code=EXIT_USAGE
        ) from None
    if not isinstance(schema, dict):
        raise CliError(
            f"--output-schema {path} is not a JSON Schema (an object)",
            hint='such as {"type": "object", "properties": {...}}',
            exit_code=EXIT_USAGE,
        )
    try:
        checked_schema(schema, taken=(), max_invalid=1, native=False)
    except ValueError as exc:
        raise CliError(str(exc), hint="fix the schema", exit_code=EXIT_USAGE) from None
    return schema


def _prompt(given: str | None) -> str:
    """The prompt argument, or stdin's text for `-` or no argument."""
    if given is not None and given != "-":
        text = given
    elif sys.stdin.isatty():
        raise CliError(
            "missing PROMPT",
            hint='trimtab run "your prompt", or pipe it in: echo "..." | trimtab run',
            exit_code=EXIT_USAGE,
        )
    else:
        text = read_input(sys.stdin.buffer, "the prompt on stdin")
    if not text.strip():
        raise CliError("the prompt is empty", hint="say something", exit_code=EXIT_USAGE)
    return text


def show_config(resolved: Resolved, *, as_json: bool) -> int:
    """The settings in force and where each comes from, then the provider they select."""
    term = Terminal.detect()
    config = resolved.config
    values = config.model_dump(mode="json")
    values["api_key"] = "(set)" if config.api_key is not None else None
    if config.store is None:
        values["store"] = str(config.home / "trimtab.db")
    choice = choose_provider(resolved, os.environ)
    config_file = str(resolved.config_file) if resolved.config_file else None
    selected = {"provider": choice.name, "model": choice.model, "reason": choice.reason}
    if as_json:
        settings = {
            name: {"value": value, "source": resolved.sources.get(name, "default")}
            for name, value in values.items()
        }
        document = {"settings": settings, "configFile": config_file, "selected": selected}
        term.line(json.dumps(document, indent=2))
        return 0
    rows = [
        [name, "-" if value is None else str(value), resolved.sources.get(name, "default")]
        for name, value in values.items()
    ]
    term.line(table(["SETTING", "VALUE", "FROM"], rows, width=None))
    term.line()
    term.line(f"config file  {config_file or '(none)'}")
    model = f" with model {choice.model}" if choice.model else ""
    term.line(f"selected     {choice.name}{model}: {choice.reason}")
    return 0
