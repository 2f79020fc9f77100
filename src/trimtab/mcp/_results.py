"""An MCP `CallToolResult` as the result of a trimtab tool call.

`isError` is a `failure`, anything else a `success`. Text contents are the result's text, in
order; an embedded text resource adds its text under its URI. trimtab's messages carry text
only, for every provider, so binary contents (images, audio, blobs) are described in one line
each (type, MIME type, size) rather than sent. A result without contents but with
`structuredContent` is that object as JSON. The text is cut at `MAX_RESULT_CHARS`, with a note
of how much was cut (and of the contents `trimtab.mcp._answers` left out before the SDK read
the result).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from trimtab._tools import ToolResult
from trimtab.mcp._answers import CONTENTS_CUT

if TYPE_CHECKING:
    import mcp_types

__all__ = ["MAX_RESULT_CHARS", "tool_result"]

MAX_RESULT_CHARS = 100_000
"""The most text one MCP result gives the model (about 25,000 tokens): a server that floods
its result must not flood the window."""


def _size(base64_data: str) -> int:
    return len(base64_data) * 3 // 4 - base64_data[-2:].count("=")


def _part(content: Any) -> str:
    kind = getattr(content, "type", None)
    if kind == "text":
        return str(content.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {content.mime_type}, {_size(content.data)} bytes]"
    if kind == "resource":
        resource = content.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri}]\n{text}"
        size = _size(getattr(resource, "blob", "") or "")
        return f"[resource {resource.uri}: {resource.mime_type or 'binary'}, {size} bytes]"
    if kind == "resource_link":
        return f"[resource link {content.uri}: {content.name}]"
    return f"[{kind} content]"


def tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    """The trimtab result of one MCP tool call."""
    parts = [_part(content) for content in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    text = "\n".join(parts)
    cut = (
        [f"{len(text) - MAX_RESULT_CHARS} more characters"] if len(text) > MAX_RESULT_CHARS else []
    )
    contents_cut = (result.meta or {}).get(CONTENTS_CUT)
    if isinstance(contents_cut, int) and contents_cut > 0:
        cut.append(f"{contents_cut} more contents")
    if cut:
        text = f"{text[:MAX_RESULT_CHARS]}\n[... {' and '.join(cut)} cut]"
    return ToolResult(
        text_result_for_llm=text, result_type="failure" if result.is_error else "success"
    )
