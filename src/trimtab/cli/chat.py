"""`trimtab chat`: an interactive session, with slash commands.

A session the chat created and left without a message in it (opened, then /new, /resume or
/exit) is deleted as it is left: only conversations are kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from trimtab import Session
from trimtab.cli.config import Resolved
from trimtab.cli.demo_tools import CLEAR_CONTEXT
from trimtab.cli.errors import CliError
from trimtab.cli.host import SessionHost
from trimtab.cli.render import Terminal, TextRenderer, printable
from trimtab.cli.runtime import (
    Approver,
    Portal,
    TerminalBridge,
    provider_type,
    read_line,
    session_error_hint,
)
from trimtab.cli.sessions import events_table, sessions_table
from trimtab.events import UserMessageEvent
from trimtab.store._files import private_directory

__all__ = ["HELP", "run_chat"]

HELP = """\
/clear <prompt>  ask the model to clear the context and go on with <prompt> (needs --tools demo)
/sessions        list the stored sessions
/resume <id>     switch to another session (a unique id prefix will do)
/new             start a new session
/events          show this session's event log
/help            show this help
/exit            leave (Ctrl-D works too); Ctrl-C stops a running reply"""


def run_chat(resolved: Resolved, *, resume: str | None, yes: bool) -> int:
    """Run the chat until /exit or end of input.

    Args:
        resume: None for a new session, "" for the last one, else a session id (or prefix).
        yes: Approve every tool call instead of asking.
    """
    term = Terminal.detect()
    history = _line_editing(resolved.config.home) if sys.stdin.isatty() else None
    approver = Approver(term, "yes" if yes else "ask", prompt_on_err=False)
    renderer = TextRenderer(term, replies=True, activity_to_err=False)
    try:
        with Portal(term) as portal, SessionHost(portal, resolved, term) as host:
            bridge = TerminalBridge(portal, term, renderer.render, approver)
            session = host.create(bridge) if resume is None else host.resume(resume or None, bridge)
            if provider_type(session) == "local":
                renderer.first_wait = "loading the embedded model"
            chat = Chat(portal, host, bridge, term, line_editing=history is not None)
            if resume is None:
                chat.created.add(session.session_id)
            chat.banner(resumed=resume is not None)
            try:
                return chat.loop()
            finally:
                chat.leave(chat.session)
    finally:
        if history is not None:
            history()


class Chat:
    """The read-send-render loop and its slash commands."""

    def __init__(
        self,
        portal: Portal,
        host: SessionHost,
        bridge: TerminalBridge,
        term: Terminal,
        *,
        line_editing: bool = False,
    ) -> None:
        self._portal = portal
        self._line_editing = line_editing
        self._host = host
        self._bridge = bridge
        self._term = term
        self.created: set[str] = set()
        """The sessions this chat created: those left empty are deleted."""
        self._commands: dict[str, Callable[[str], bool]] = {
            "/clear": self._clear,
            "/sessions": self._sessions,
            "/resume": self._resume,
            "/new": self._new,
            "/events": self._events,
            "/help": self._help,
            "/exit": self._exit,
            "/quit": self._exit,
        }

    @property
    def session(self) -> Session:
        """The session being talked to."""
        return self._bridge.session

    def banner(self, *, resumed: bool) -> None:
        """Which session this is, with what model and tools, and how to get help."""
        session = self.session
        config = session.config
        provider = provider_type(session)
        tools = ", ".join(tool.name for tool in config.tools) or "none"
        verb = "resumed" if resumed else "new"
        self._term.line(
            self._term.paint(
                printable(
                    f"trimtab chat: {verb} session {session.session_id}"
                    f" ({provider}, {config.model or 'default model'}; tools: {tools})"
                ),
                "dim",
            )
        )
        self._term.line(self._term.paint("Type /help for commands, Ctrl-D to leave.", "dim"))

    def loop(self) -> int:
        """Read lines until /exit or end of input; returns the exit code."""
        prompt = self._prompt()
        while True:
            try:
                line = read_line(self._term, prompt).strip()
            except EOFError:
                self._term.line()
                return 0
            except KeyboardInterrupt:
                self._term.line()
                self._term.note("(type /exit or press Ctrl-D to leave)")
                continue
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not self._command(line):
                        return 0
                else:
                    self._send(line)
            except CliError as exc:
                # A failed command (an unknown id, ...) must not end the chat.
                self._term.error(exc.message, exc.hint)

    def _prompt(self) -> str:
        coloured = self._term.paint("you>", "bold", "green")
        if coloured == "you>" or not self._line_editing:
            return coloured + " "
        # Readline must be told (\001 ... \002) that colour codes take no room on the line.
        start, end = coloured.split("you>")
        return f"\001{start}\002you>\001{end}\002 "

    def _send(self, text: str) -> bool:
        outcome = self._bridge.drive(text)
        if outcome.aborted and outcome.prompt_event is not None:
            # Ctrl-C withdraws the request: the window forgets the interrupted exchange (the
            # log keeps it), so the next prompt is not answered together with it (spec L6).
            self._portal.call(self.session.history.truncate(outcome.prompt_event))
            self._term.note("(the interrupted request is left out of the conversation)")
        if outcome.error is not None:
            error = outcome.error
            hint = session_error_hint(error, provider_type(self.session))
            self._term.error(f"{error.error_type}: {error.message}", hint)
        return outcome.cleared

    def _command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        name, _, argument = line.partition(" ")
        command = self._commands.get(name.lower())
        if command is None:
            self._term.error(f"unknown command {name}", "type /help for the commands")
            return True
        return command(argument.strip())

    def _clear(self, prompt: str) -> bool:
        if not prompt:
            self._term.error("/clear needs a prompt", "/clear <what the fresh context starts with>")
        elif CLEAR_CONTEXT not in self.session.tools:
            self._term.note(
                "/clear works through the clear_context tool, which this session lacks: a context"
                " is only cleared from inside a tool call. Start with --tools demo, or use /new."
            )
        else:
            self._bridge.approver.requested_clear = prompt
            try:
                cleared = self._send(
                    f"Call the {CLEAR_CONTEXT} tool now with exactly this prompt:"
                    f" {_quoted(prompt)}. Do nothing else."
                )
            finally:
                self._bridge.approver.requested_clear = None
            if not cleared:
                self._term.note("The model did not clear the context; the conversation goes on.")
        return True

    def _sessions(self, _: str) -> bool:
        records = [(record, self._host.status(record)) for record in self._host.records()]
        if not records:
            self._term.line("no sessions")
        else:
            current = self.session.session_id
            self._term.line(sessions_table(records, self._term.width, current=current))
        return True

    def _resume(self, wanted: str) -> bool:
        if not wanted:
            self._term.error("/resume needs a session id", "/sessions lists them")
            return True
        previous = self.session
        if self._host.find(wanted) == previous.session_id:
            self._term.note("(already in this session)")
            return True
        self._host.resume(wanted, self._bridge)
        self.leave(previous)
        self.banner(resumed=True)
        return True

    def _new(self, _: str) -> bool:
        previous = self.session
        self.created.add(self._host.create(self._bridge).session_id)
        self.leave(previous)
        self.banner(resumed=False)
        return True

    def leave(self, session: Session) -> None:
        """Let go of a session; delete it if this chat created it and it holds no message."""
        self._portal.call(session.disconnect())
        if session.session_id not in self.created:
            return
        events = self._host.events(session.session_id)
        if not any(isinstance(event, UserMessageEvent) for event in events):
            self._portal.call(self._host.client.delete_session(session.session_id))

    def _events(self, _: str) -> bool:
        events = self._host.events(self.session.session_id)
        self._term.line(events_table(events, self._term.width))
        return True

    def _help(self, _: str) -> bool:
        self._term.line(HELP)
        return True

    def _exit(self, _: str) -> bool:
        return False


_QUOTE_PAIRS = (('"', '"'), ("\u201c", "\u201d"), ("\u00ab", "\u00bb"), ("'", "'"))


def _quoted(text: str) -> str:
    """`text` in quotes it does not contain, so that where it ends is plain to a model (the
    embedded one copies a quoted text as the argument: a quote inside it would cut it short).
    Not JSON: a small model does not read its escapes."""
    for opening, closing in _QUOTE_PAIRS:
        if opening not in text and closing not in text:
            return f"{opening}{text}{closing}"
    return f'"{text}"'


def _line_editing(home: Path) -> Callable[[], None] | None:
    """Turn on line editing and history for input(); returns what saves the history."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input() still works
        return None
    path = home.expanduser() / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass  # no history yet
    readline.set_history_length(1000)

    def save() -> None:
        try:
            private_directory(path.parent)  # the prompts are as private as the sessions (S5)
            readline.write_history_file(path)  # readline writes it 0600
        except OSError:
            pass  # a read-only home must not turn a finished chat into an error

    return save
