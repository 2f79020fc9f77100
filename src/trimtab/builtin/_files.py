"""`view`, `create` and `edit`: the Copilot CLI's file tools (spec B3).

Their results read as the CLI's do: `view` numbers lines `N. text`, `create` says
`Created file P with N characters`, `edit` says `File P updated with changes.`, and a
missing path is `Path P does not exist. Please provide a valid path.`
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trimtab._errors import ToolError
from trimtab._tools import ToolResult
from trimtab.builtin._base import BuiltinTool, builtin
from trimtab.builtin._directory import Outside, WorkingDirectory

__all__ = ["MAX_EDIT", "confined", "create_tool", "edit_tool", "missing", "regular", "view_tool"]

MAX_EDIT = 16 * 1024 * 1024
"""Bytes of a file `edit` reads whole (and a write request diffs): larger ones are refused."""
_MAX_ENTRIES = 1000
"""Entries a directory listing shows."""
_CONTEXT = 3
"""Lines of context around a change in a write request's diff (difflib's default)."""
_HUNK = re.compile(r"(?<=^@@ )-(\d+)(,\d+)? \+(\d+)(,\d+)?")
_IMAGES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp"})


class _Params(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)


class ViewParams(_Params):
    path: str = Field(
        description="Path of a file or directory: absolute, or relative to the working directory."
    )
    view_range: list[int] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="[start, end]: the 1-based lines to show, both included; an end of -1 "
        "reads to the end of the file. Without it the whole file is shown.",
    )


class CreateParams(_Params):
    path: str = Field(description="Path of the new file: absolute, or relative.")
    file_text: str = Field(description="The new file's whole text.")


class EditParams(_Params):
    path: str = Field(description="Path of the file to change: absolute, or relative.")
    old_str: str = Field(
        description="The text to replace: it must appear exactly once in the file, "
        "whitespace included."
    )
    new_str: str = Field(default="", description="The text that replaces it.")


def missing(shown: str) -> ToolError:
    """The CLI's words for a path that does not exist."""
    return ToolError(f"Path {shown} does not exist. Please provide a valid path.")


def regular(real: Path, shown: str) -> None:
    """Refuse what is not a regular file: opening a FIFO waits for a writer for ever, and a
    device may never end."""
    if not stat.S_ISREG(real.stat().st_mode):
        raise ToolError(f"{shown} is not a regular file.")


def confined(handler: Callable[[Any], str]) -> Callable[[Any], str | ToolResult]:
    """`handler`, its paths checked again as it runs (a link may have changed since the
    call was approved): a path outside the working directory ends the call `denied`."""

    def run(params: Any) -> str | ToolResult:
        try:
            return handler(params)
        except Outside as refused:
            return ToolResult(text_result_for_llm=str(refused), result_type="denied")

    return run


def view_tool(directory: WorkingDirectory, output_limit: int) -> BuiltinTool:
    def view(params: ViewParams) -> str:
        real, shown = directory.resolve(params.path), directory.shown(params.path)
        if not os.path.lexists(real):
            raise missing(shown)
        try:
            if real.is_dir():
                return _listing(real, output_limit)
            regular(real, shown)
            if real.suffix.lower() in _IMAGES:
                raise ToolError(f"{shown} is an image: trimtab's view shows text files only.")
            start, end = _range(params.view_range)
            return _numbered(real, shown, start, end, output_limit)
        except OSError as exc:
            raise ToolError(f"Cannot read {shown}: {exc.strerror or exc}.") from None

    return builtin(
        "view",
        "Show a text file with numbered lines (all of it, or a range of lines), or list "
        "a directory two levels deep.",
        ViewParams,
        confined(view),
        asks=lambda p: _read_request(directory, p.path, "View"),
        checks=lambda p: directory.resolve(p.path),
    )


def create_tool(directory: WorkingDirectory) -> BuiltinTool:
    def create(params: CreateParams) -> str:
        real, shown = directory.resolve(params.path), directory.shown(params.path)
        if os.path.lexists(real):
            raise ToolError(f"Path {shown} already exists. Use edit to change it.")
        try:
            real.parent.mkdir(parents=True, exist_ok=True)
            # "x": never through a link someone put there since the check.
            with open(real, "x", encoding="utf-8", newline="") as file:
                file.write(params.file_text)
        except OSError as exc:
            raise ToolError(f"Cannot create {shown}: {exc.strerror or exc}.") from None
        return f"Created file {shown} with {len(params.file_text)} characters"

    def asks(params: CreateParams) -> dict[str, Any]:
        shown = directory.shown(params.path)
        return _write_request(shown, f"Create {shown}", "", params.file_text) | {
            "new_file_contents": params.file_text
        }

    return builtin(
        "create",
        "Create a new file with the given text (its missing directories too). "
        "It must not exist yet.",
        CreateParams,
        confined(create),
        asks=asks,
        checks=lambda p: directory.resolve(p.path),
    )


def edit_tool(directory: WorkingDirectory) -> BuiltinTool:
    def edit(params: EditParams) -> str:
        real, shown = directory.resolve(params.path), directory.shown(params.path)
        before = _text(real, shown)
        after = _replaced(before, params.old_str, params.new_str, shown)
        try:
            _write_over(real, after)
        except OSError as exc:
            raise ToolError(f"Cannot write {shown}: {exc.strerror or exc}.") from None
        return f"File {shown} updated with changes."

    def asks(params: EditParams) -> dict[str, Any]:
        shown = directory.shown(params.path)
        request = _write_request(shown, f"Edit {shown}", "", "")
        try:
            before = _text(directory.resolve(params.path), shown)
            _replaced(before, params.old_str, params.new_str, shown)
        except (ToolError, Outside):
            return request  # the call will fail: nothing would be written
        return request | {"diff": _edit_diff(shown, before, params.old_str, params.new_str)}

    return builtin(
        "edit",
        "Replace one exact occurrence of old_str in a file with new_str. old_str must "
        "appear exactly once; include surrounding lines to make it unique.",
        EditParams,
        confined(edit),
        asks=asks,
        checks=lambda p: directory.resolve(p.path),
    )


def _read_request(directory: WorkingDirectory, path: str, verb: str) -> dict[str, Any]:
    shown = directory.shown(path)
    return {"kind": "read", "path": shown, "intention": f"{verb} {shown}"}


def _write_request(shown: str, intention: str, before: str, after: str) -> dict[str, Any]:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), shown, shown
    )
    return {
        "kind": "write",
        "file_name": shown,
        "diff": "".join(lines),
        "intention": intention,
        "can_offer_session_approval": True,
    }


def _edit_diff(shown: str, before: str, old: str, new: str) -> str:
    """The unified diff of replacing the one `old` in `before`, computed over the lines it
    spans and their context only: a request for a large file costs what the change does."""
    at = before.index(old)
    first = before.count("\n", 0, at)
    last = first + old.count("\n")
    lines = before.splitlines(keepends=True)
    low, high = max(first - _CONTEXT, 0), min(last + _CONTEXT + 1, len(lines))
    segment = "".join(lines[low:high])
    changed = segment.replace(old, new, 1)  # `old` occurs once in the file, so here
    diff = difflib.unified_diff(
        segment.splitlines(keepends=True), changed.splitlines(keepends=True), shown, shown
    )

    def shifted(match: re.Match[str]) -> str:
        return f"-{int(match[1]) + low}{match[2] or ''} +{int(match[3]) + low}{match[4] or ''}"

    return "".join(_HUNK.sub(shifted, line, count=1) for line in diff)


def _range(view_range: list[int] | None) -> tuple[int, int | None]:
    if view_range is None:
        return 1, None
    start, end = view_range
    if start < 1 or (end != -1 and end < start):
        raise ToolError(
            f"Invalid view_range [{start}, {end}]: start is a line number from 1, and end "
            "is one at or after it, or -1 for the end of the file."
        )
    return start, None if end == -1 else end


def _numbered(real: Path, shown: str, start: int, end: int | None, limit: int) -> str:
    """Lines `start` to `end` as `N. text`, read a line at a time and at most `limit`
    bytes of them kept: a huge file, or one huge line, never sits in memory whole."""
    out: list[str] = []
    size = number = 0
    ended_by_newline = True  # an empty file is one empty line, as "a\n" ends with one
    with open(real, "rb") as file:
        if b"\x00" in file.read(8192):
            raise ToolError(f"{shown} is a binary file: view shows text files only.")
        file.seek(0)
        while end is None or number < end:
            line, whole = _line(file, limit)
            if not line and whole:
                break  # the end of the file
            number += 1
            ended_by_newline = line.endswith(b"\n")
            if number < start:
                continue
            text = line.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace")
            entry = f"{number}. {text}" if text else f"{number}."
            size += len(entry) + 1
            if size > limit or not whole:
                out.append(f"[the output is cut at {limit} bytes: view a range from line {number}]")
                return "\n".join(out)
            out.append(entry)
        else:
            return "\n".join(out)
    if ended_by_newline and start <= number + 1 and (end is None or number + 1 <= end):
        out.append(f"{number + 1}.")  # the empty line after the last newline
    if not out:
        raise ToolError(f"Invalid view_range: {shown} has {number} lines.")
    return "\n".join(out)


def _line(file: Any, limit: int) -> tuple[bytes, bool]:
    """The next line, and whether it was read whole: a line over `limit` bytes is read on
    to its end in bounded pieces and cut."""
    line: bytes = file.readline(limit)
    if len(line) < limit or line.endswith(b"\n"):
        return line, True
    while (rest := file.readline(65536)) and not rest.endswith(b"\n"):
        pass
    return line, False


def _listing(real: Path, limit: int) -> str:
    """The directory's entries two levels deep, sorted, hidden ones left out; a
    subdirectory ends in `/`. Links are listed, not followed."""
    lines: list[str] = []
    size = 0

    def walk(directory: Path, prefix: str, depth: int) -> bool:
        nonlocal size
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return True  # unreadable: listed, not entered
        for entry in entries:
            if entry.name.startswith("."):
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            name = f"{prefix}{entry.name}{'/' if is_dir else ''}"
            size += len(name) + 1
            if len(lines) >= _MAX_ENTRIES or size > limit:
                return False
            lines.append(name)
            if is_dir and depth < 2 and not walk(Path(entry.path), name, depth + 1):
                return False
        return True

    if not walk(real, "", 1):
        lines.append(f"[the listing is cut at {len(lines)} entries]")
    return "\n".join(lines)


def _text(real: Path, shown: str) -> str:
    """A file's whole text, for `edit`."""
    if not os.path.lexists(real):
        raise missing(shown)
    try:
        if real.is_dir():
            raise ToolError(f"Path {shown} is a directory: edit changes files.")
        regular(real, shown)
        if real.stat().st_size > MAX_EDIT:
            raise ToolError(f"{shown} is over {MAX_EDIT // 2**20} MiB: edit changes smaller files.")
        with open(real, encoding="utf-8", newline="") as file:
            return file.read()
    except UnicodeDecodeError:
        raise ToolError(f"{shown} is not UTF-8 text: edit changes text files.") from None
    except OSError as exc:
        raise ToolError(f"Cannot read {shown}: {exc.strerror or exc}.") from None


def _replaced(text: str, old: str, new: str, shown: str) -> str:
    """`text` with the one occurrence of `old` replaced (spec B3)."""
    if not old:
        raise ToolError("old_str is empty: give the exact text to replace.")
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"No match found for old_str in {shown}: nothing was changed. old_str must "
            "match the file's text exactly, whitespace and indentation included."
        )
    if count > 1:
        lines, at = [], 0
        for _ in range(min(count, 10)):
            at = text.index(old, at)
            lines.append(str(text.count("\n", 0, at) + 1))
            at += 1
        raise ToolError(
            f"old_str matches {count} places in {shown} (lines {', '.join(lines)}): nothing "
            "was changed. Include more of the surrounding text to make it unique."
        )
    return text.replace(old, new, 1)


def _write_over(real: Path, text: str) -> None:
    """Replace the file's text at once: a crash leaves the old file or the new, never half
    of one. The file keeps its mode."""
    fd, temporary = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as file:
            file.write(text)
        os.chmod(temporary, real.stat().st_mode & 0o7777)
        os.replace(temporary, real)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
