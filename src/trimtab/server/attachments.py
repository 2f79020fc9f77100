"""A `send`'s attachments, made into text the model reads after the prompt (spec D11).

trimtab's messages carry text, for every provider: a file or a selection is its text, a
directory its listing, a blob its text when it is text and a one-line description otherwise
(an image included). Each is bounded, and anything that cannot be read is refused with a
clear error before anything is stored.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
from pathlib import Path

from trimtab.protocol.wire import (
    Attachment,
    BlobAttachment,
    DirectoryAttachment,
    FileAttachment,
    SelectionAttachment,
)

__all__ = ["MAX_BLOB_BYTES", "MAX_ENTRIES", "MAX_TEXT_BYTES", "with_attachments"]

MAX_TEXT_BYTES = 256 * 1024
"""Bytes of a file (or text blob) the model is given; the rest is cut, with a note."""

MAX_ENTRIES = 200
"""Entries of a directory listed; more are counted, not named."""

MAX_BLOB_BYTES = 10 * 1024 * 1024
"""The largest blob accepted (decoded)."""


async def with_attachments(prompt: str, attachments: list[Attachment]) -> str:
    """`prompt` followed by each attachment as text.

    Raises:
        ValueError: An attachment that cannot be read, or is too large.
    """
    parts = [prompt]
    for attachment in attachments:
        match attachment:
            case FileAttachment():
                parts.append(await asyncio.to_thread(_file, attachment))
            case DirectoryAttachment():
                parts.append(await asyncio.to_thread(_directory, attachment))
            case SelectionAttachment():
                parts.append(await asyncio.to_thread(_selection, attachment))
            case BlobAttachment():
                parts.append(_blob(attachment))
    return "\n\n".join(parts)


def _wrap(kind: str, name: str, where: str | None, body: str) -> str:
    place = f' path="{where}"' if where else ""
    return f'<attachment type="{kind}" name="{name}"{place}>\n{body}\n</attachment>'


def _path(given: str, what: str) -> Path:
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise ValueError(f"attachment {what} path must be absolute: {given!r}")
    return path


def _read(path: Path, what: str) -> bytes:
    """The first `MAX_TEXT_BYTES` (plus one, to tell a cut) of a file."""
    try:
        with path.open("rb") as file:
            return file.read(MAX_TEXT_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"attachment {what} not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"attachment {what} is a directory: {path}") from None
    except OSError as exc:
        raise ValueError(f"attachment {what} cannot be read: {path}: {exc.strerror}") from None


def _text(data: bytes, size: int) -> str | None:
    """`data` as text with a note when it was cut; None when it is not UTF-8 text."""
    cut = len(data) > MAX_TEXT_BYTES
    try:
        text = data[:MAX_TEXT_BYTES].decode("utf-8", "ignore" if cut else "strict")
    except UnicodeDecodeError:
        return None
    if "\x00" in text:
        return None
    return text + (f"\n[cut: the first {MAX_TEXT_BYTES} of {size} bytes]" if cut else "")


def _file(attachment: FileAttachment) -> str:
    path = _path(attachment.path, "file")
    data = _read(path, "file")
    name = attachment.display_name or path.name
    text = _text(data, _size(path))
    if text is None:
        return _wrap("file", name, str(path), f"[binary file, {_size(path)} bytes]")
    if attachment.line_range is not None:
        lines = text.splitlines()
        start, end = attachment.line_range.start, attachment.line_range.end
        text = "\n".join(lines[start - 1 : end])
    return _wrap("file", name, str(path), text)


def _directory(attachment: DirectoryAttachment) -> str:
    path = _path(attachment.path, "directory")
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        raise ValueError(f"attachment directory not found: {path}") from None
    except NotADirectoryError:
        raise ValueError(f"attachment directory is a file: {path}") from None
    except OSError as exc:
        raise ValueError(f"attachment directory cannot be read: {path}: {exc.strerror}") from None
    listed = [e.name + ("/" if e.is_dir() else "") for e in entries[:MAX_ENTRIES]]
    if len(entries) > MAX_ENTRIES:
        listed.append(f"[and {len(entries) - MAX_ENTRIES} more entries]")
    name = attachment.display_name or path.name
    return _wrap("directory", name, str(path), "\n".join(listed) or "[empty]")


def _selection(attachment: SelectionAttachment) -> str:
    path = _path(attachment.file_path, "selection's file")
    name = attachment.display_name or path.name
    selection = attachment.selection
    where = str(path)
    if selection is not None:
        where += f":{selection.start.line + 1}-{selection.end.line + 1}"
    if attachment.text is not None:
        return _wrap("selection", name, where, attachment.text)
    text = _text(_read(path, "selection's file"), _size(path))
    if text is None:
        raise ValueError(f"attachment selection's file is not text: {path}")
    if selection is not None:
        lines = text.splitlines()[selection.start.line : selection.end.line + 1]
        if lines:
            lines[-1] = lines[-1][: selection.end.character]
            lines[0] = lines[0][selection.start.character :]
        text = "\n".join(lines)
    return _wrap("selection", name, where, text)


def _blob(attachment: BlobAttachment) -> str:
    if len(attachment.data) > MAX_BLOB_BYTES * 4 // 3 + 4:
        raise ValueError(f"attachment blob is larger than {MAX_BLOB_BYTES} bytes")
    try:
        data = base64.b64decode(attachment.data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("attachment blob data is not base64") from None
    name = attachment.display_name or "blob"
    mime = attachment.mime_type
    text = _text(data, len(data)) if mime.startswith("text/") else None
    if text is None:
        kind = "image" if mime.startswith("image/") else "binary data"
        text = f"[{kind}: {mime}, {len(data)} bytes; trimtab gives the model text only]"
    return _wrap("blob", name, None, text)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
