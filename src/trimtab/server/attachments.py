"""A `send`'s attachments, made into text the model reads after the prompt (spec D11), and
images it is shown (spec D14).

A file or a selection is its text, a directory its listing, a blob its text when it is text
and a one-line description otherwise. An image (a blob, or a file, of a type every provider
with images takes) is described in the text too, and shown as an image where the session's
provider takes images. Each is bounded, and anything that cannot be read is refused with a
clear error before anything is stored. What the client attached is recorded with the message
in the protocol's shapes (`Composed.attachments`), its data left out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import mimetypes
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from trimtab.events import Image
from trimtab.protocol.wire import (
    Attachment,
    BlobAttachment,
    DirectoryAttachment,
    FileAttachment,
    SelectionAttachment,
)

__all__ = [
    "MAX_BLOB_BYTES",
    "MAX_ENTRIES",
    "MAX_TEXT_BYTES",
    "Composed",
    "Opener",
    "with_attachments",
]

MAX_TEXT_BYTES = 256 * 1024
"""Bytes of a file (or text blob) the model is given; the rest is cut, with a note."""

MAX_ENTRIES = 200
"""Entries of a directory listed; more are counted, not named."""

MAX_BLOB_BYTES = 10 * 1024 * 1024
"""The largest blob, or image file, accepted (decoded)."""

_IMAGE_TYPES = frozenset(get_args(Image.model_fields["mime_type"].annotation))

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Opener = Callable[[Path, int, str], int]
"""Opens a path a client named, with `os.open` flags, for the attachment kind it names: a
descriptor, or an error (`HostPolicy.open` decides which files a server's clients may read)."""


def _open_any(path: Path, flags: int, what: str) -> int:
    return os.open(path, flags)


@dataclass
class Composed:
    """A send's prompt with its attachments."""

    prompt: str
    """The prompt, then each attachment as text."""
    images: list[Image] = field(default_factory=list)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    """What was attached, in the shapes of the protocol's `user.message` (spec D14)."""


async def with_attachments(
    prompt: str, attachments: list[Attachment], *, opener: Opener = _open_any
) -> Composed:
    """`prompt` followed by each attachment as text, and the images among them.

    Every file and directory is opened through `opener` (by default, any the server's user
    can read).

    Raises:
        ValueError: An attachment that cannot be read, or is too large.
        PolicyRefusedError: `opener` refused a path.
    """
    composed = Composed(prompt)
    parts = [prompt]
    for attachment in attachments:
        match attachment:
            case FileAttachment():
                parts.append(await asyncio.to_thread(_file, attachment, composed, opener))
            case DirectoryAttachment():
                parts.append(await asyncio.to_thread(_directory, attachment, composed, opener))
            case SelectionAttachment():
                parts.append(await asyncio.to_thread(_selection, attachment, composed, opener))
            case BlobAttachment():
                parts.append(_blob(attachment, composed))
    composed.prompt = "\n\n".join(parts)
    return composed


def _wrap(kind: str, name: str, where: str | None, body: str) -> str:
    place = f' path="{where}"' if where else ""
    return f'<attachment type="{kind}" name="{name}"{place}>\n{body}\n</attachment>'


def _path(given: str, what: str) -> Path:
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise ValueError(f"attachment {what} path must be absolute: {given!r}")
    return path


def _read(path: Path, what: str, opener: Opener, whole: int | None = None) -> tuple[bytes, int]:
    """The first `MAX_TEXT_BYTES` (plus one, to tell a cut) of a file, and its size; with
    `whole`, all of it, refused when larger."""
    try:
        # Non-blocking, and regular files only: opening a FIFO would wait for a writer for
        # ever, and a device or a descriptor of the server's own (`/dev/stdin`: on stdio,
        # the JSON-RPC stream itself) is no file to show the model.
        fd = opener(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC, f"attachment {what}")
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"attachment {what} is not a regular file: {path}")
            data = file.read((whole or MAX_TEXT_BYTES) + 1)
            if whole is not None and len(data) > whole:
                raise ValueError(f"attachment {what} is larger than {whole} bytes: {path}")
            return data, info.st_size
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


def _file(attachment: FileAttachment, composed: Composed, opener: Opener) -> str:
    path = _path(attachment.path, "file")
    name = attachment.display_name or path.name
    described: dict[str, Any] = {"type": "file", "path": str(path), "displayName": name}
    if attachment.line_range is not None:
        described["lineRange"] = attachment.line_range.model_dump()
    composed.attachments.append(described)
    mime = mimetypes.guess_type(path.name)[0]
    if mime is not None and mime in _IMAGE_TYPES:
        data, _ = _read(path, "file", opener, MAX_BLOB_BYTES)
        described |= {"mimeType": mime, "byteLength": len(data)}
        return _wrap("file", name, str(path), _image(mime, data, composed))
    data, size = _read(path, "file", opener)
    text = _text(data, size)
    if text is None:
        return _wrap("file", name, str(path), f"[binary file, {size} bytes]")
    if attachment.line_range is not None:
        lines = text.splitlines()
        start, end = attachment.line_range.start, attachment.line_range.end
        text = "\n".join(lines[start - 1 : end])
    return _wrap("file", name, str(path), text)


def _directory(attachment: DirectoryAttachment, composed: Composed, opener: Opener) -> str:
    path = _path(attachment.path, "directory")
    try:
        entries = _entries(path, opener)
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
    composed.attachments.append({"type": "directory", "path": str(path), "displayName": name})
    return _wrap("directory", name, str(path), "\n".join(listed) or "[empty]")


def _entries(path: Path, opener: Opener) -> list[os.DirEntry[str]]:
    """The directory's entries, sorted by name, read from the directory `opener` opened
    (where the system lists a directory by descriptor; elsewhere by its path, once opened)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
    fd = opener(path, flags, "attachment directory")
    try:
        with os.scandir(fd if os.scandir in os.supports_fd else path) as listing:
            return sorted(listing, key=lambda e: e.name)
    finally:
        os.close(fd)


def _selection(attachment: SelectionAttachment, composed: Composed, opener: Opener) -> str:
    path = _path(attachment.file_path, "selection's file")
    name = attachment.display_name or path.name
    selection = attachment.selection
    where = str(path)
    if selection is not None:
        where += f":{selection.start.line + 1}-{selection.end.line + 1}"
    # With its text given, the selection reads no file.
    text = attachment.text
    if text is None:
        text = _selected(path, attachment, opener)
    # The protocol's selection names its range: none given is the whole text.
    lines = text.split("\n")
    whole = {"start": {"line": 0, "character": 0}}
    whole["end"] = {"line": len(lines) - 1, "character": len(lines[-1])}
    described: dict[str, Any] = {"type": "selection", "filePath": str(path), "text": text}
    described["displayName"] = name
    described["selection"] = selection.model_dump() if selection is not None else whole
    composed.attachments.append(described)
    return _wrap("selection", name, where, text)


def _selected(path: Path, attachment: SelectionAttachment, opener: Opener) -> str:
    """The selection's text, read from its file."""
    selection = attachment.selection
    text = _text(*_read(path, "selection's file", opener))
    if text is None:
        raise ValueError(f"attachment selection's file is not text: {path}")
    if selection is not None:
        lines = text.splitlines()[selection.start.line : selection.end.line + 1]
        if lines:
            lines[-1] = lines[-1][: selection.end.character]
            lines[0] = lines[0][selection.start.character :]
        text = "\n".join(lines)
    return text


def _blob(attachment: BlobAttachment, composed: Composed) -> str:
    if len(attachment.data) > MAX_BLOB_BYTES * 4 // 3 + 4:
        raise ValueError(f"attachment blob is larger than {MAX_BLOB_BYTES} bytes")
    try:
        data = base64.b64decode(attachment.data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("attachment blob data is not base64") from None
    name = attachment.display_name or "blob"
    mime = attachment.mime_type
    described: dict[str, Any] = {"type": "blob", "mimeType": mime, "byteLength": len(data)}
    composed.attachments.append(
        described | ({"displayName": name} if attachment.display_name else {})
    )
    if mime in _IMAGE_TYPES:
        return _wrap("blob", name, None, _image(mime, data, composed))
    text = _text(data, len(data)) if mime.startswith("text/") else None
    if text is None:
        kind = "image" if mime.startswith("image/") else "binary data"
        text = f"[{kind}: {mime}, {len(data)} bytes; not shown to the model]"
    return _wrap("blob", name, None, text)


def _image(mime: str, data: bytes, composed: Composed) -> str:
    """Show the model `data` as an image; the note that stands for it in the text."""
    composed.images.append(
        Image.model_validate({"mime_type": mime, "data": base64.b64encode(data).decode()})
    )
    return f"[image: {mime}, {len(data)} bytes]"
