"""A server's answers, checked before the SDK reads them (spec MCP11, MCP12).

The SDK validates a `tools/list` page whole: one tool whose `inputSchema` is not an object
fails the page, and every tool of the server with it. And it makes a model of every content
of a `tools/call` result, some 2 KB each, however few characters they hold. `AnswerChecks`
sits between a transport and the SDK's session and looks at those two answers first: a tool
the SDK's model for the connection's protocol version rejects, or whose input schema no
provider takes (a `type` other than `object`, not plain JSON, not valid JSON Schema), leaves
the list with the reason noted, and the server's other tools stay; a result's contents past
the first `MAX_CONTENTS` leave it, their number noted in its `_meta` (`CONTENTS_CUT`) for the
note the model reads (`trimtab.mcp._results`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import ValidationError

if TYPE_CHECKING:
    import mcp_types
    from mcp.client._transport import ReadStream, Transport, TransportStreams, WriteStream
    from mcp.shared.message import SessionMessage
    from mcp_types import RequestId

    import mcp

__all__ = ["CONTENTS_CUT", "MAX_CONTENTS", "AnswerChecks", "Listing", "list_tools"]

MAX_CONTENTS = 1_000
"""The most contents of one result the SDK reads: more than the model could be shown of any
but the shortest (`MAX_RESULT_CHARS` in all)."""

_MAX_ASKED = 10_000
"""Requests remembered at most, so that those never answered cannot add up."""

CONTENTS_CUT = "trimtab/contentsCut"
"""The `_meta` key of a result that says how many of its contents were left out."""

_MAX_PAGES = 100
"""Pages read at most: a server whose cursor never ends cannot hang a turn."""


class Listing(NamedTuple):
    """A server's tools a session can use, and those left out with the reason."""

    tools: list[mcp_types.Tool]
    dropped: dict[str, str]


async def list_tools(client: mcp.Client, checks: AnswerChecks) -> Listing:
    """Every page of the tools of `client`'s server, whose transport `checks` filters."""
    checks.dropped.clear()
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return Listing(tools, dict(checks.dropped))


class AnswerChecks:
    """A transport whose `tools/list` and `tools/call` answers are checked (module doc).

    `dropped` maps each tool left out since it was last cleared to the reason.
    """

    def __init__(self, transport: Transport, version: Callable[[], str | None]) -> None:
        self.dropped: dict[str, str] = {}
        self._transport = transport
        self._version = version
        """The connection's protocol version, once its handshake is done."""
        self._asked: dict[RequestId, str] = {}
        """The method of each `tools/list` and `tools/call` request not answered yet."""

    async def __aenter__(self) -> TransportStreams:
        read, write = await self._transport.__aenter__()
        return _Answers(read, self), _Requests(write, self)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        return await self._transport.__aexit__(exc_type, exc, traceback)

    def sent(self, item: SessionMessage) -> None:
        from mcp_types import JSONRPCRequest

        message = item.message
        if isinstance(message, JSONRPCRequest) and message.method in ("tools/list", "tools/call"):
            self._asked[message.id] = message.method
            if len(self._asked) > _MAX_ASKED:  # requests abandoned unanswered (timeouts)
                del self._asked[next(iter(self._asked))]

    def received(self, item: SessionMessage | Exception) -> None:
        from mcp.shared.message import SessionMessage
        from mcp_types import JSONRPCError, JSONRPCResponse

        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if not isinstance(message, JSONRPCResponse | JSONRPCError) or message.id is None:
            return
        method = self._asked.pop(message.id, None)
        if method == "tools/list" and isinstance(message, JSONRPCResponse):
            self._check_tools(message.result)
        elif method == "tools/call" and isinstance(message, JSONRPCResponse):
            _cut_contents(message.result)

    def _check_tools(self, page: dict[str, Any]) -> None:
        """Take the tools no session could use out of `page`, in place."""
        from mcp_types.methods import validate_server_result

        tools = page.get("tools")
        version = self._version()
        if not isinstance(tools, list) or version is None:
            return  # not a list of tools at all: the SDK says so for the whole page
        rest = {key: value for key, value in page.items() if key != "tools"}

        def rejected(tool: Any) -> str | None:
            try:
                validate_server_result("tools/list", version, {**rest, "tools": [tool]})
            except ValidationError as exc:
                return _first_error(exc)
            except (KeyError, ValueError):
                pass  # a protocol version the SDK has no model for: nothing to hold it to
            return None

        if rejected({"name": "-", "inputSchema": {"type": "object"}}) is not None:
            return  # the page is wrong beyond its tools: the SDK says so
        kept = []
        for tool in tools:
            reason = _unusable(tool) or rejected(tool)
            if reason is None:
                kept.append(tool)
            else:
                name = tool.get("name") if isinstance(tool, dict) else None
                self.dropped[name if isinstance(name, str) else repr(name)] = reason
        page["tools"] = kept


def _cut_contents(result: dict[str, Any]) -> None:
    """Leave out the contents of `result` past `MAX_CONTENTS`, noting how many, in place."""
    contents, meta = result.get("content"), result.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return  # malformed: the SDK says so
    if isinstance(meta, dict):
        meta.pop(CONTENTS_CUT, None)  # the server's own word on it does not count
    if isinstance(contents, list) and len(contents) > MAX_CONTENTS:
        result["content"] = contents[:MAX_CONTENTS]
        result["_meta"] = {**(meta or {}), CONTENTS_CUT: len(contents) - MAX_CONTENTS}


def _unusable(tool: Any) -> str | None:
    """Why no provider would take `tool`'s input schema as a function's parameters."""
    from jsonschema import Draft7Validator, SchemaError
    from jsonschema.validators import validator_for

    schema = tool.get("inputSchema") if isinstance(tool, dict) else None
    if not isinstance(schema, dict):
        return "its inputSchema is not a JSON object"
    kind = schema.get("type", "object")
    if kind != "object":
        return f'its inputSchema\'s type is {json.dumps(kind)[:100]}, not "object"'
    try:
        json.dumps(schema, allow_nan=False)
        # Draft 7's meta-schema unless the schema names its own: it takes every later keyword
        # as well, and checks a schema in a quarter of the time of 2020-12's (1 ms, not 5).
        validator_for(schema, default=Draft7Validator).check_schema(schema)
    except (ValueError, TypeError) as exc:
        return f"its inputSchema is not plain JSON ({exc})"
    except SchemaError as exc:
        return f"its inputSchema is not valid JSON Schema ({exc.message[:200]})"
    except RecursionError:
        return "its inputSchema is nested too deeply"
    return None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"][2:]) or "the tool"
    return f"its listing does not validate ({where}: {error['msg']})"


class _Requests:
    """The session's end of the transport's write stream, noting `tools/list` requests."""

    def __init__(self, stream: WriteStream[SessionMessage], owner: AnswerChecks) -> None:
        self._stream = stream
        self._owner = owner

    async def send(self, item: SessionMessage, /) -> None:
        self._owner.sent(item)
        await self._stream.send(item)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Requests:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Answers:
    """The session's end of the transport's read stream, checking `tools/list` answers."""

    def __init__(self, stream: ReadStream[SessionMessage | Exception], owner: AnswerChecks) -> None:
        self._stream = stream
        self._owner = owner

    @property
    def last_context(self) -> Any:
        """The sender's context of the last item, where the transport keeps it."""
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        item = await self._stream.receive()
        self._owner.received(item)
        return item

    def __aiter__(self) -> _Answers:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Answers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
