"""`grep` and `glob`: the Copilot CLI's search tools, whose output is ripgrep's (spec B4).

Files are found as ripgrep finds them by default, less its `.gitignore` rules: hidden files
and directories are skipped, links to directories are not followed, and binary files (a NUL
byte in their first 8 KiB) are not searched. A file a link makes appear in the working
directory but that lies outside it is skipped too. Paths are shown as ripgrep shows them:
under the `path` argument as given, `./` when there is none (`./src/index.ts`); a file named
directly as given.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trimtab._errors import ToolError
from trimtab.builtin._base import BuiltinTool, builtin
from trimtab.builtin._directory import Outside, WorkingDirectory
from trimtab.builtin._files import confined, missing, regular

__all__ = ["glob_pattern", "glob_tool", "grep_tool"]

_MAX_LINE = 1024 * 1024
"""Bytes of one line of a large file that are searched; the rest of the line is skipped."""
_WHOLE = 8 * 1024 * 1024
"""Files up to this size are read whole (and `multiline` reads this much of a file)."""
_ANCHORED = re.compile(r"\\[AZ]")


class GrepParams(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, defer_build=True)

    pattern: str = Field(description="The regular expression to search for.")
    path: str | None = Field(
        default=None,
        description="A file or directory to search: absolute, or relative. Default: the "
        "working directory.",
    )
    output_mode: Literal["content", "files_with_matches", "count"] = Field(
        default="files_with_matches",
        description="content: the matching lines; files_with_matches: the files that match; "
        "count: how many lines match in each file.",
    )
    glob: str | None = Field(default=None, description="Search only files matching this glob.")
    ignore_case: bool = Field(default=False, alias="-i", description="Ignore case.")
    line_numbers: bool = Field(default=False, alias="-n", description="content: number lines.")
    after: int = Field(default=0, ge=0, alias="-A", description="content: lines after a match.")
    before: int = Field(default=0, ge=0, alias="-B", description="content: lines before a match.")
    around: int = Field(default=0, ge=0, alias="-C", description="content: lines around a match.")
    head_limit: int | None = Field(
        default=None, ge=1, description="Show only the first N lines of the output."
    )
    multiline: bool = Field(
        default=False, description="Let the pattern span lines ('.' matches newlines too)."
    )


class GlobParams(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    pattern: str = Field(description="The glob, e.g. '**/*.py' or 'src/**/*.ts'.")
    path: str | None = Field(
        default=None, description="The directory to search in. Default: the working directory."
    )


def grep_tool(directory: WorkingDirectory, output_limit: int, time_limit: float) -> BuiltinTool:
    def grep(params: GrepParams) -> str:
        flags = (re.IGNORECASE if params.ignore_case else 0) | (
            re.DOTALL | re.MULTILINE if params.multiline else 0
        )
        try:
            pattern = re.compile(params.pattern, flags)
        except re.error as exc:
            raise ToolError(f"Invalid regular expression {params.pattern!r}: {exc}.") from None
        only = glob_pattern(params.glob) if params.glob else None
        out = _Output(output_limit, params.head_limit)
        deadline = time.monotonic() + time_limit
        for real, shown in _files(directory, params.path, only, deadline, out):
            if out.full:
                break
            _search(real, shown, pattern, params, out)
        return out.text("No matches found.")

    return builtin(
        "grep",
        "Search file contents with a regular expression (ripgrep's syntax and output).",
        GrepParams,
        confined(grep),
        asks=lambda p: _read_request(directory, p.path, "Search"),
        checks=lambda p: directory.resolve(p.path or "."),
    )


def glob_tool(directory: WorkingDirectory, output_limit: int, time_limit: float) -> BuiltinTool:
    def glob(params: GlobParams) -> str:
        matcher = glob_pattern(params.pattern)
        out = _Output(output_limit, None)
        deadline = time.monotonic() + time_limit
        for _, shown in _files(directory, params.path, matcher, deadline, out):
            out.add(shown)
            if out.full:
                break
        return out.text("No files matched the pattern.")

    return builtin(
        "glob",
        "Find files whose path matches a glob pattern ('**' crosses directories).",
        GlobParams,
        confined(glob),
        asks=lambda p: _read_request(directory, p.path, "Find files in"),
        checks=lambda p: directory.resolve(p.path or "."),
    )


def _read_request(directory: WorkingDirectory, path: str | None, verb: str) -> dict[str, Any]:
    shown = directory.shown(path or ".")
    return {"kind": "read", "path": shown, "intention": f"{verb} {shown}"}


class _Output:
    """Result lines, within a byte limit and an optional line count."""

    def __init__(self, limit: int, head: int | None) -> None:
        self.lines: list[str] = []
        self._limit, self._head, self._size = limit, head, 0
        self.cut: str | None = None
        """Why the output stops short, if it does."""

    @property
    def full(self) -> bool:
        return self.cut is not None or (self._head is not None and len(self.lines) >= self._head)

    def add(self, line: str) -> None:
        if self.full:
            return
        self._size += len(line) + 1
        if self._size > self._limit:
            self.cut = f"[the output is cut at {self._limit} bytes]"
        else:
            self.lines.append(line)

    def text(self, empty: str) -> str:
        if not self.lines and self.cut is None:
            return empty
        return "\n".join([*self.lines, *([self.cut] if self.cut else [])])


def _files(
    directory: WorkingDirectory,
    path: str | None,
    only: re.Pattern[str] | None,
    deadline: float,
    out: _Output,
) -> Iterator[tuple[Path, str]]:
    """The files to search, sorted, with their shown paths."""
    given = path or "."
    real = directory.resolve(given)
    if not os.path.lexists(real):
        raise missing(directory.shown(given))
    if not real.is_dir():
        try:
            regular(real, given)
        except OSError as exc:
            raise ToolError(f"Cannot read {given}: {exc.strerror or exc}.") from None
        yield real, given
        return
    base = given.rstrip("/") or "/"
    for folder, names in _walk(real):
        if time.monotonic() > deadline:
            out.cut = "[the search stopped: it took too long; name a narrower path]"
            return
        for name in names:
            file = folder / name
            relative = file.relative_to(real).as_posix()
            if only is not None and not only.fullmatch(relative):
                continue
            if file.is_symlink():
                try:
                    target = directory.resolve(str(file))
                except Outside:
                    continue  # it leads out of the working directory
                if not target.is_file():
                    continue
            yield file, f"{base}/{relative}"


def _walk(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """Each directory under `root` (itself first) with its files' names, sorted, hidden
    entries left out, links to directories not followed."""
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        files, subdirectories = [], []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirectories.append(Path(entry.path))
                elif entry.is_file() or entry.is_symlink():
                    files.append(entry.name)
            except OSError:
                continue
        yield directory, files
        pending.extend(reversed(subdirectories))


def _search(
    real: Path, shown: str, pattern: re.Pattern[str], params: GrepParams, out: _Output
) -> None:
    try:
        with open(real, "rb") as file:
            head = file.read(8192)
            if b"\x00" in head:
                return
            if params.multiline:
                text = (head + file.read(_WHOLE - len(head))).decode("utf-8", "replace")
                _report_multiline(text, shown, pattern, params, out)
                return
            if os.fstat(file.fileno()).st_size > _WHOLE:
                file.seek(0)
                _report_lines(_streamed(file), shown, pattern, params, out)
                return
            text = (head + file.read()).decode("utf-8", "replace")
    except OSError:
        return  # unreadable: skipped, as ripgrep skips it (with a note on its stderr)
    # Most files do not match: one search of the whole text says so (without \A or \Z, a
    # line's match is a match of the whole text in MULTILINE mode).
    if not _ANCHORED.search(pattern.pattern):
        whole = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
        if not whole.search(text):
            return
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # after the last newline
    _report_lines(iter(lines), shown, pattern, params, out)


def _streamed(file: Any) -> Iterator[str]:
    """A large file's lines, each read within `_MAX_LINE` bytes (the rest of a longer line
    is skipped)."""
    while line := file.readline(_MAX_LINE):
        if len(line) == _MAX_LINE and not line.endswith(b"\n"):
            while (rest := file.readline(65536)) and not rest.endswith(b"\n"):
                pass
        yield line.rstrip(b"\n").decode("utf-8", "replace")


def _report_lines(
    lines: Iterator[str], shown: str, pattern: re.Pattern[str], params: GrepParams, out: _Output
) -> None:
    before = max(params.before, params.around)
    after = max(params.after, params.around)
    content = params.output_mode == "content"
    recent: deque[tuple[int, str]] = deque(maxlen=before)  # unshown lines, for -B
    count = number = shown_up_to = trailing = 0
    for line in lines:
        number += 1
        text = line.removesuffix("\r")
        if pattern.search(text):
            count += 1
            if params.output_mode == "files_with_matches":
                out.add(shown)
                return
            if content:
                first = recent[0][0] if recent else number
                if (before or after) and shown_up_to and first > shown_up_to + 1:
                    out.add("--")  # ripgrep's separator between groups of lines
                for n, previous in recent:
                    out.add(_line(shown, n, previous, params.line_numbers, "-"))
                recent.clear()
                out.add(_line(shown, number, text, params.line_numbers, ":"))
                shown_up_to, trailing = number, after
        elif content and trailing:
            out.add(_line(shown, number, text, params.line_numbers, "-"))
            shown_up_to, trailing = number, trailing - 1
        else:
            recent.append((number, text))
        if out.full:
            return
    if params.output_mode == "count" and count:
        out.add(f"{shown}:{count}")


def _report_multiline(
    text: str, shown: str, pattern: re.Pattern[str], params: GrepParams, out: _Output
) -> None:
    matches = list(pattern.finditer(text))
    if not matches:
        return
    if params.output_mode == "files_with_matches":
        out.add(shown)
    elif params.output_mode == "count":
        out.add(f"{shown}:{len(matches)}")
    else:
        lines = text.split("\n")
        for match in matches:
            first = text.count("\n", 0, match.start())
            last = first + match.group().count("\n")
            for n in range(first, min(last + 1, len(lines))):
                out.add(_line(shown, n + 1, lines[n], params.line_numbers, ":"))


def _line(shown: str, number: int, text: str, numbered: bool, mark: str) -> str:
    return f"{shown}{mark}{number}{mark}{text}" if numbered else f"{shown}{mark}{text}"


def glob_pattern(glob: str) -> re.Pattern[str]:
    """The regular expression a glob stands for, as ripgrep's `--glob` reads it: a glob
    without `/` matches a file's name at any depth; `**` crosses directories, `*` and `?`
    do not; `[...]` is a class (`[!...]` negated) and `{a,b}` either."""
    glob = glob.removeprefix("./").lstrip("/")
    if "/" not in glob:
        glob = "**/" + glob
    return re.compile(_translated(glob), re.DOTALL)


def _translated(glob: str) -> str:
    parts: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if glob.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            parts.append(".*")
            i += 2
        elif char == "[" and (close := glob.find("]", i + 2)) != -1:
            inner = glob[i + 1 : close]
            negated = inner.startswith("!")
            inner = (inner[1:] if negated else inner).replace("\\", "\\\\")
            parts.append(f"[{'^' if negated else ''}{inner}]")
            i = close + 1
        elif char == "{" and (close := glob.find("}", i)) != -1:
            options = glob[i + 1 : close].split(",")
            parts.append("(?:" + "|".join(_translated(o) for o in options) + ")")
            i = close + 1
        else:
            parts.append({"*": "[^/]*", "?": "[^/]"}.get(char) or re.escape(char))
            i += 1
    return "".join(parts)
