"""What the command line prints: the terminal's streams and spinner, live event rendering
(as text or JSON lines), one-line event descriptions and tables.

Colour and the spinner are for terminals only: a stream that is not a TTY gets plain text,
and `NO_COLOR` or `TERM=dumb` turn colour off everywhere. Text that comes from a session's log
(ids, messages, tool names and output, errors) may hold anything a model, a tool or a client
put there: it is printed through `printable`, so that it cannot drive the terminal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from pydantic import BaseModel

from trimtab import Event
from trimtab.events import (
    AbortEvent,
    AssistantMessageDeltaEvent,
    AssistantMessageEvent,
    AssistantTurnEndEvent,
    AssistantTurnStartEvent,
    AssistantUsageEvent,
    CompactionCompleteData,
    PermissionCompletedEvent,
    PermissionRequestedEvent,
    SessionCompactionCompleteEvent,
    SessionCompactionStartEvent,
    SessionContextClearedEvent,
    SessionErrorEvent,
    SessionIdleEvent,
    SessionStartEvent,
    SessionWarningEvent,
    ToolExecutionCompleteData,
    ToolExecutionCompleteEvent,
    ToolExecutionStartEvent,
    ToolRequest,
    UserMessageEvent,
)

__all__ = [
    "JsonRenderer",
    "Spinner",
    "Terminal",
    "TextRenderer",
    "describe",
    "event_json",
    "format_time",
    "one_line",
    "printable",
    "table",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0, DEL and C1: ESC starts the sequences that move the cursor, recolour or retitle a
terminal, and C1's CSI (U+009B) does the same on some."""


def printable(text: str, *, keep: str = "", json: bool = False) -> str:
    """`text` with its control characters shown as escapes (`\\x1b`), so that printing it
    cannot drive the terminal; those in `keep` (newline and tab, in replies) stay as they are.

    With `json`, `text` is JSON and the escapes are JSON's (`\\u009b`): in JSON a control
    character is either whitespace between tokens (kept) or, for DEL and C1, raw inside a
    string, where the escape reads back as the same character.
    """

    def escape(match: re.Match[str]) -> str:
        char = match.group()
        if char in keep or (json and char in "\n\r\t"):
            return char
        return f"\\u{ord(char):04x}" if json else f"\\x{ord(char):02x}"

    return _CONTROL.sub(escape, text)


_STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def _wants_color(stream: TextIO, env: Mapping[str, str]) -> bool:
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    return stream.isatty()


def _is_utf8(stream: TextIO) -> bool:
    return (getattr(stream, "encoding", None) or "").lower().replace("-", "") == "utf8"


class Spinner:
    """A progress line on stderr while something slow runs; silent when stderr is not a TTY.

    The owner calls `tick()` every ~0.1 s while waiting. Nothing is drawn for the first
    `DELAY` seconds, so quick steps do not flicker.
    """

    DELAY = 0.25

    def __init__(self, stream: TextIO, *, enabled: bool, unicode: bool) -> None:
        self._stream = stream
        self._enabled = enabled
        self._frames = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏" if unicode else "|/-\\"
        self._label: str | None = None
        self._since = 0.0
        self._drawn = False

    @property
    def active(self) -> bool:
        """A label is set: something is in progress."""
        return self._label is not None

    def start(self, label: str) -> None:
        """Show `label` from now on (after the delay)."""
        if self._label is None:
            self._since = time.monotonic()
        self._label = printable(label)

    def tick(self) -> None:
        """Draw the next frame, with the seconds spent so far."""
        if not (self._enabled and self._label):
            return
        elapsed = time.monotonic() - self._since
        if elapsed < self.DELAY:
            return
        frame = self._frames[int(elapsed * 10) % len(self._frames)]
        self._stream.write(f"\r\x1b[K{frame} {self._label} {elapsed:.0f}s")
        self._stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the line (the next `tick` draws it again)."""
        if self._drawn:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._drawn = False

    def stop(self) -> None:
        """Erase the line and forget the label."""
        self.clear()
        self._label = None


class Terminal:
    """stdout and stderr, whether each gets colour, and the spinner.

    Every write goes through here, so that the spinner's line is erased before any output.
    """

    def __init__(
        self, out: TextIO, err: TextIO, *, color_out: bool, color_err: bool, spinner: bool
    ) -> None:
        self.out = out
        self.err = err
        self._color = {id(out): color_out, id(err): color_err}
        self.unicode = _is_utf8(out)
        self.spinner = Spinner(err, enabled=spinner, unicode=self.unicode)

    @classmethod
    def detect(cls, env: Mapping[str, str] | None = None) -> Terminal:
        """The process's own streams, with colour and spinner where they are terminals."""
        env = os.environ if env is None else env
        out, err = sys.stdout, sys.stderr
        return cls(
            out,
            err,
            color_out=_wants_color(out, env),
            color_err=_wants_color(err, env),
            spinner=err.isatty() and env.get("TERM") != "dumb",
        )

    @property
    def width(self) -> int | None:
        """Columns of the terminal stdout is, or None for a pipe (no truncation)."""
        return shutil.get_terminal_size().columns if self.out.isatty() else None

    def paint(self, text: str, *styles: str, err: bool = False) -> str:
        """`text` in the given styles when that stream gets colour."""
        stream = self.err if err else self.out
        if not styles or not self._color[id(stream)]:
            return text
        codes = ";".join(_STYLES[style] for style in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def write(self, text: str, *, err: bool = False) -> None:
        """Write and flush, after erasing the spinner's line."""
        self.spinner.clear()
        stream = self.err if err else self.out
        stream.write(text)
        stream.flush()

    def line(self, text: str = "", *, err: bool = False) -> None:
        """Write one line."""
        self.write(text + "\n", err=err)

    def error(self, message: str, hint: str | None = None) -> None:
        """The CLI's error format: one line, then an optional hint line (stderr)."""
        label = self.paint("error:", "bold", "red", err=True)
        self.line(f"{label} {printable(message)}", err=True)
        if hint:
            self.line(f"{self.paint('hint:', 'dim', err=True)} {printable(hint)}", err=True)

    def note(self, message: str) -> None:
        """A one-line notice on stderr, such as the provider chosen."""
        self.line(self.paint(printable(message), "dim", err=True), err=True)


# --- live rendering ----------------------------------------------------------------------


def event_json(event: Event) -> str:
    """One event in the wire shape (camelCase, no nulls), as one line of JSON."""
    data = event.model_dump(by_alias=True, mode="json", exclude_none=True)
    return printable(json.dumps(data, ensure_ascii=False), json=True)


class JsonRenderer:
    """Every event, ephemeral ones included, as one JSON object per line on stdout."""

    def __init__(self, term: Terminal) -> None:
        self._term = term

    def render(self, event: Event) -> None:
        """Print one event."""
        self._term.line(event_json(event))


class TextRenderer:
    """A run as a person watches it: streamed replies, tool calls and their outcomes.

    Args:
        term: Where to write.
        replies: Print the assistant's text as it streams (on stdout). Off for `run` into a
            pipe, whose stdout gets only the final reply.
        activity_to_err: Write tool calls and notices to stderr (`run`), not stdout (`chat`).
    """

    def __init__(self, term: Terminal, *, replies: bool, activity_to_err: bool) -> None:
        self._term = term
        self._replies = replies
        self._err = activity_to_err
        self._mid_line = False
        """Streamed text was printed without its final newline."""
        self._streamed = False
        """The current message arrived in deltas, so its final event must not print it again."""
        self.first_wait = "thinking"
        """The spinner's label for the first model call, such as "loading the model"."""

    def render(self, event: Event) -> None:
        """Show one event (many show nothing)."""
        spinner = self._term.spinner
        match event:
            case AssistantTurnStartEvent():
                self._end_line()
                spinner.start(self.first_wait)
                self.first_wait = "thinking"
            case AssistantMessageDeltaEvent() if self._replies:
                spinner.stop()
                self._term.write(printable(event.data.delta_content, keep="\n\t"))
                self._mid_line = not event.data.delta_content.endswith("\n")
                self._streamed = True
            case AssistantMessageEvent():
                spinner.stop()
                self._assistant_message(event)
            case ToolExecutionStartEvent():
                spinner.stop()
                self._say(self._call_text(event.data.tool_name, event.data.arguments), "cyan")
                spinner.start(f"running {event.data.tool_name}")
            case PermissionRequestedEvent():
                spinner.stop()
            case ToolExecutionCompleteEvent():
                spinner.stop()
                self._tool_outcome(event.data)
            case SessionContextClearedEvent():
                data = event.data
                text = f"context cleared ({data.messages_cleared} messages); "
                self._say(text + f"fresh context starts with: {one_line(data.initial_message)}")
            case AbortEvent():
                self._say("(aborted)", "yellow")
            case SessionCompactionStartEvent():
                self._end_line()
                spinner.start("compacting the conversation")
            case SessionCompactionCompleteEvent():
                spinner.stop()
                self._compacted(event.data)
            case SessionWarningEvent():
                self._say(f"warning: {event.data.message}", "yellow")
            case AssistantTurnEndEvent() | SessionErrorEvent() | SessionIdleEvent():
                spinner.stop()
                self._end_line()
            case _:
                pass  # the rest (usage, permission results, ...) is for the event log only

    def _assistant_message(self, event: AssistantMessageEvent) -> None:
        if not self._replies:
            return
        if self._streamed:
            self._end_line()
        elif event.data.content:
            self._term.line(printable(event.data.content, keep="\n\t"))
        self._streamed = False

    def _call_text(self, name: str, arguments: Any) -> str:
        mark = "⚙" if self._term.unicode else "*"
        return f"{mark} {name} {one_line(_compact(arguments), 200)}"

    def _tool_outcome(self, data: ToolExecutionCompleteData) -> None:
        ok, bad = ("✓", "✗") if self._term.unicode else ("ok", "!!")
        if data.outcome == "success":
            text = data.result.content if data.result else ""
            self._say(f"  {ok} {one_line(text, 300)}", "green")
        else:
            text = data.error.message if data.error else ""
            self._say(f"  {bad} {data.outcome}: {one_line(text, 300)}", "yellow")

    def _compacted(self, data: CompactionCompleteData) -> None:
        if data.success:
            self._say(f"(conversation compacted: {data.messages_removed} messages summarised)")
        else:
            self._say(f"compaction failed: {data.error or 'unknown error'}", "yellow")

    def _say(self, text: str, *styles: str) -> None:
        self._end_line()
        self._term.line(self._term.paint(printable(text), *styles, err=self._err), err=self._err)

    def _end_line(self) -> None:
        if self._mid_line:
            self._term.line()
            self._mid_line = False


# --- descriptions and tables -------------------------------------------------------------


def one_line(text: str, limit: int = 120) -> str:
    """`text` on one line, shortened to `limit` characters, control characters escaped."""
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _requests(requests: Sequence[ToolRequest]) -> str:
    return ", ".join(f"{r.name} {_compact(r.arguments)}" for r in requests)


def describe(event: Event) -> str:
    """What one event says, on one line, for event tables.

    Events the command line has no words for are described by their data, so that new event
    types of the runtime show up readably without a change here.
    """
    match event:
        case SessionStartEvent():
            config = event.data.config
            provider = (config.provider or {}).get("type", "?")
            return f"model={config.model or '-'} provider={provider} tools={len(config.tools)}"
        case UserMessageEvent():
            seed = "(seed) " if event.data.source == "context_cleared" else ""
            return seed + one_line(event.data.content)
        case AssistantMessageEvent():
            calls = _requests(event.data.tool_requests or [])
            return one_line(event.data.content or ("-> " + calls if calls else ""))
        case AssistantUsageEvent():
            usage = event.data
            return f"{usage.model} in={usage.input_tokens} out={usage.output_tokens}"
        case ToolExecutionStartEvent():
            return one_line(f"{event.data.tool_name} {_compact(event.data.arguments)}")
        case ToolExecutionCompleteEvent():
            done = event.data
            text = done.result.content if done.result else done.error.message if done.error else ""
            return one_line(f"{done.tool_name or done.tool_call_id} {done.outcome}: {text}")
        case PermissionRequestedEvent():
            return event.data.permission_request.tool_name
        case PermissionCompletedEvent():
            return event.data.result.kind
        case SessionContextClearedEvent():
            cleared = event.data.messages_cleared
            return one_line(f"{cleared} messages; seed: {event.data.initial_message}")
        case SessionErrorEvent():
            return one_line(f"{event.data.error_type}: {event.data.message}")
        case _:
            return _generic(event)


_ID_FIELDS = frozenset({"messageId", "requestId", "toolCallId", "originatingMessageId"})
"""Fields too long and too opaque for a one-line description."""


def _generic(event: Event) -> str:
    data = getattr(event, "data", None)
    if not isinstance(data, BaseModel):
        return ""
    fields = data.model_dump(by_alias=True, mode="json", exclude_none=True)
    pairs = (f"{key}={_compact(value)}" for key, value in fields.items() if key not in _ID_FIELDS)
    return one_line(" ".join(pairs))


def format_time(moment: datetime, *, with_date: bool = True) -> str:
    """A timestamp in local time, to the second."""
    local = moment.astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, width: int | None) -> str:
    """Left-aligned columns; the last one is shortened to fit `width` (None: never). Cells are
    printed as `printable` makes them."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(size) for cell, size in zip(row[:-1], widths, strict=False)]
        line = "  ".join([*cells, row[-1]])
        if width is not None and len(line) > width:
            line = line[: max(width - 1, 0)] + "…"
        lines.append(line.rstrip())
    return "\n".join(lines)
