"""A `send`'s attachments, rendered into the text the model reads as the reference runtime
renders them (spec D11), and images it is shown (spec D14).

Files and directories are named in a `<tagged_files>` block after the prompt, one line each
(`* /path (12 lines)`, `* /dir (3 items)`): the model reads them with its tools, as it does
under the reference runtime. A selection is quoted before the prompt in an `<ide_selection>`
block; an image is shown as an image, named after the prompt; another blob is its text when it
is text and a one-line description otherwise. Every file and directory is opened through the
server's `Opener` (its host policy), and anything that cannot be read is refused with a clear
error before anything is stored. What the client attached is recorded with the message in the
protocol's shapes (`Composed.attachments`), its data left out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import mimetypes
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, get_args

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
    "MAX_COUNTED_BYTES",
    "MAX_TEXT_BYTES",
    "Composed",
    "Opener",
    "with_attachments",
]

MAX_TEXT_BYTES = 256 * 1024
"""Bytes of a selection's file (or of a text blob) read for the model; the rest is cut, with a
note."""

MAX_BLOB_BYTES = 10 * 1024 * 1024
"""The largest blob, or image file, accepted (decoded)."""

MAX_COUNTED_BYTES = 64 * 1024 * 1024
"""Bytes of a file whose lines are counted for its `<tagged_files>` line; past them the line
says how many lines there are at least."""

GAP = "\n\n\n\n"
"""Between the prompt and the blocks around it, as the reference runtime's requests have it."""

SELECTION_NOTE = (
    "The user has the following text selected in their IDE. This may or may not be related"
    " to their request."
)

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
    """`prompt` with its attachments rendered around it, and the images among them.

    Every file and directory is opened through `opener` (by default, any the server's user
    can read).

    Raises:
        ValueError: An attachment that cannot be read, or is too large.
        PolicyRefusedError: `opener` refused a path.
    """
    composed = Composed(prompt)
    selections: list[str] = []
    named: list[str] = []
    """Lines after the prompt: the images' names."""
    tagged: list[str] = []
    blobs: list[str] = []
    for attachment in attachments:
        match attachment:
            case FileAttachment():
                line, image = await asyncio.to_thread(_file, attachment, composed, opener)
                (named if image else tagged).append(line)
            case DirectoryAttachment():
                tagged.append(await asyncio.to_thread(_directory, attachment, composed, opener))
            case SelectionAttachment():
                selection = await asyncio.to_thread(_selection, attachment, composed, opener)
                selections.append(selection)
            case BlobAttachment():
                blob, image = _blob(attachment, composed)
                if blob is not None:
                    (named if image else blobs).append(blob)
    text = GAP.join([*selections, "\n".join([prompt, *named])])
    if tagged:
        text += f"{GAP}<tagged_files>\n" + "\n".join(tagged) + "\n</tagged_files>"
    composed.prompt = "\n\n".join([text, *blobs])
    return composed


def _wrap(kind: str, name: str, body: str) -> str:
    return f'<attachment type="{kind}" name="{name}">\n{body}\n</attachment>'


def _path(given: str, what: str) -> Path:
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise ValueError(f"attachment {what} path must be absolute: {given!r}")
    return path


@contextlib.contextmanager
def _opened(path: Path, what: str, opener: Opener) -> Iterator[tuple[IO[bytes], int]]:
    """The regular file at `path`, opened through `opener` for reading, and its size;
    `ValueError` for anything else."""
    try:
        # Non-blocking, and regular files only: opening a FIFO would wait for a writer for
        # ever, and a device or a descriptor of the server's own (`/dev/stdin`: on stdio,
        # the JSON-RPC stream itself) is no file to show the model.
        fd = opener(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC, f"attachment {what}")
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"attachment {what} is not a regular file: {path}")
            yield file, info.st_size
    except FileNotFoundError:
        raise ValueError(f"attachment {what} not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"attachment {what} is a directory: {path}") from None
    except OSError as exc:
        raise ValueError(f"attachment {what} cannot be read: {path}: {exc.strerror}") from None


def _read(path: Path, what: str, opener: Opener, whole: int | None = None) -> tuple[bytes, int]:
    """The first `MAX_TEXT_BYTES` (plus one, to tell a cut) of a file, and its size; with
    `whole`, all of it, refused when larger."""
    with _opened(path, what, opener) as (file, size):
        data = file.read((whole or MAX_TEXT_BYTES) + 1)
    if whole is not None and len(data) > whole:
        raise ValueError(f"attachment {what} is larger than {whole} bytes: {path}")
    return data, size


def _lines(path: Path, what: str, opener: Opener) -> tuple[int, bool, bool, int]:
    """How many lines the file has (a last one without a newline counts), whether it is
    text (UTF-8 without NUL), whether it was counted whole (`MAX_COUNTED_BYTES`), and its
    size."""
    count, counted, last, text = 0, 0, b"\n", True
    decoder = codecs.getincrementaldecoder("utf-8")()
    with _opened(path, what, opener) as (file, size):
        while counted < MAX_COUNTED_BYTES and (chunk := file.read(1024 * 1024)):
            counted += len(chunk)
            count += chunk.count(b"\n")
            last = chunk[-1:]
            text = text and b"\x00" not in chunk and _decodes(decoder, chunk)
        whole = not file.read(1)
    text = text and (not whole or _decodes(decoder, b"", final=True))
    return count + (last != b"\n"), text, whole, size


def _decodes(decoder: codecs.IncrementalDecoder, data: bytes, *, final: bool = False) -> bool:
    try:
        decoder.decode(data, final)
    except UnicodeDecodeError:
        return False
    return True


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


def _file(attachment: FileAttachment, composed: Composed, opener: Opener) -> tuple[str, bool]:
    """The file's `<tagged_files>` line, or an image's name; whether it is an image."""
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
        _image(mime, data, composed)
        return name, True
    count, text, whole, size = _lines(path, "file", opener)
    if not text:
        line = f"* {path} (binary file, {size} bytes)"
    else:
        total = f"{count} lines" if whole else f"at least {count} lines"
        span = attachment.line_range
        if span is None:
            line = f"* {path} ({total})"
        elif span.start == span.end:
            line = f"* {path} (line {span.start} of {total})"
        else:
            line = f"* {path} (lines {span.start}-{span.end} of {total})"
    described["taggedFilesEntry"] = line
    return line, False


def _directory(attachment: DirectoryAttachment, composed: Composed, opener: Opener) -> str:
    """The directory's `<tagged_files>` line: its path and how many entries it has."""
    path = _path(attachment.path, "directory")
    try:
        count = len(_entries(path, opener))
    except FileNotFoundError:
        raise ValueError(f"attachment directory not found: {path}") from None
    except NotADirectoryError:
        raise ValueError(f"attachment directory is a file: {path}") from None
    except OSError as exc:
        raise ValueError(f"attachment directory cannot be read: {path}: {exc.strerror}") from None
    name = attachment.display_name or path.name
    line = f"* {path} ({count} items)"
    composed.attachments.append(
        {"type": "directory", "path": str(path), "displayName": name, "taggedFilesEntry": line}
    )
    return line


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
    """The selection's `<ide_selection>` block: its file, its lines, its text."""
    path = _path(attachment.file_path, "selection's file")
    name = attachment.display_name or path.name
    selection = attachment.selection
    where = f"File: {name}"
    if selection is not None:
        first, last = selection.start.line + 1, selection.end.line + 1
        where += f" (line {first})" if first == last else f" (lines {first}-{last})"
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
    return f"<ide_selection>\n{SELECTION_NOTE}\n{where}\n```\n{text}\n```\n</ide_selection>"


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


def _blob(attachment: BlobAttachment, composed: Composed) -> tuple[str | None, bool]:
    """An image's name (None when it has none), or another blob's `<attachment>` block;
    whether it is an image."""
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
        _image(mime, data, composed)
        return attachment.display_name, True
    text = _text(data, len(data)) if mime.startswith("text/") else None
    if text is None:
        kind = "image" if mime.startswith("image/") else "binary data"
        text = f"[{kind}: {mime}, {len(data)} bytes; not shown to the model]"
    return _wrap("blob", name, text), False


def _image(mime: str, data: bytes, composed: Composed) -> None:
    """Show the model `data` as an image, after the message's text."""
    composed.images.append(
        Image.model_validate({"mime_type": mime, "data": base64.b64encode(data).decode()})
    )
