"""A client's sessions that declare a tool alike share one definition of it (a server's
thousand sessions of one client would otherwise hold a thousand copies of its schema)."""

from __future__ import annotations

import gc
import json
import weakref
from typing import Any

from trimtab.protocol.wire import WireTool

DECLARED: dict[str, Any] = {
    "name": "echo",
    "description": "Echo the text.",
    "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"text": {"type": "string"}},
    },
}


def definition(declared: dict[str, Any]) -> Any:
    # Through JSON, as each session's declaration arrives: equal, never the same objects.
    return WireTool.model_validate(json.loads(json.dumps(declared))).definition()


def test_tools_declared_alike_share_one_definition() -> None:
    first = definition(DECLARED)
    assert definition(DECLARED) is first
    assert "$schema" not in first.parameters  # (as each definition is made)


def test_tools_declared_otherwise_do_not() -> None:
    first = definition(DECLARED)
    other = definition({**DECLARED, "description": "Say it back."})
    terminal = definition({**DECLARED, "isTerminal": True})
    schema = definition({**DECLARED, "parameters": {"type": "object", "properties": {}}})
    assert len({id(d) for d in (first, other, terminal, schema)}) == 4
    assert other.description == "Say it back."
    assert terminal.is_terminal and not first.is_terminal
    assert schema.parameters == {"type": "object", "properties": {}}


def test_a_definition_no_session_holds_is_not_kept() -> None:
    held = weakref.ref(definition({**DECLARED, "name": "once"}))
    gc.collect()
    assert held() is None
    assert definition({**DECLARED, "name": "once"}).name == "once"
