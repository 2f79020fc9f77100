"""A hand-written MCP server (standard library only) that misbehaves on purpose.

    python faulty.py MODE

It speaks the 2025 protocol (the `initialize` handshake, one JSON-RPC message per line) and
offers `ok` and a tool per mode: `exit` exits before the handshake, `crash` dies in a call,
`hang` never answers `hang`, `malformed` answers `bad` with a result of the wrong shape,
`flood` writes 20 MB to stderr and returns 300,000 characters, `stubborn` ignores the end of
its stdin and SIGTERM and starts a child that does too, `changes` adds a tool on `grow` and
sends `notifications/tools/list_changed`, `schemas` lists `ok` and `also` with three tools
whose input schemas no provider takes, `huge` answers `huge` with `chars` characters of text
in `items` contents. When `TRIMTAB_TEST_PIDS` names a directory, every
process it starts leaves a file named after its pid there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MODE = sys.argv[1]
_MODE_TOOLS = {
    "crash": "crash",
    "hang": "hang",
    "malformed": "bad",
    "flood": "flood",
    "schemas": "also",
    "huge": "huge",
}
TOOLS = {
    "ok": "Answer fine",
    "grow" if MODE == "changes" else _MODE_TOOLS.get(MODE, "ok"): "The tool of this mode",
}
SCHEMAS: dict[str, object] = {}
if MODE == "schemas":
    SCHEMAS = {
        "not_an_object": "a string",
        "of_type_string": {"type": "string"},
        "not_json_schema": {"type": "object", "properties": {"a": {"type": 5}}},
    }
    TOOLS.update(dict.fromkeys(SCHEMAS, "A tool no provider takes"))


def record_pid() -> None:
    pids = os.environ.get("TRIMTAB_TEST_PIDS")
    if pids:
        Path(pids, str(os.getpid())).touch()


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def text(request_id: object, value: str) -> None:
    send({"id": request_id, "result": {"content": [{"type": "text", "text": value}]}})


def call(request_id: object, name: str, arguments: dict[str, int]) -> None:
    if name == "crash":
        os._exit(3)
    if name == "hang":
        return
    if name == "bad":
        send({"id": request_id, "result": {"content": "not a list"}})
    elif name == "flood":
        chunk = "x" * 65_536 + "\n"
        for _ in range(320):
            sys.stderr.write(chunk)
        sys.stderr.flush()
        text(request_id, "y" * 300_000)
    elif name == "huge":
        items = arguments["items"]
        content = [{"type": "text", "text": "y" * (arguments["chars"] // items)}] * items
        send({"id": request_id, "result": {"content": content}})
    elif name == "grow":
        TOOLS["extra"] = "Added by grow"
        send({"method": "notifications/tools/list_changed"})
        text(request_id, "grown")
    elif name in TOOLS:
        text(request_id, "fine" if name == "ok" else name)
    else:
        send({"id": request_id, "error": {"code": -32602, "message": f"no tool {name}"}})


def serve() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        request_id, method = message.get("id"), message.get("method")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            info = {"name": f"faulty-{MODE}", "version": "1"}
            capabilities = {"tools": {"listChanged": MODE == "changes"}}
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": capabilities,
                "serverInfo": info,
            }
            send({"id": request_id, "result": result})
        elif method == "tools/list":
            tools = [
                {"name": n, "description": d, "inputSchema": SCHEMAS.get(n, {"type": "object"})}
                for n, d in TOOLS.items()
            ]
            send({"id": request_id, "result": {"tools": tools}})
        elif method == "tools/call":
            params = message["params"]
            call(request_id, params["name"], params.get("arguments") or {})
        else:
            send({"id": request_id, "error": {"code": -32601, "message": f"no {method}"}})


def main() -> None:
    record_pid()
    if MODE == "exit":
        sys.stderr.write("faulty: refusing to start\n")
        sys.exit(3)
    if MODE == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = [sys.executable, __file__, "stubborn-child"]
        subprocess.Popen(child, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    if MODE == "stubborn-child":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    serve()
    if MODE == "stubborn":
        while True:  # stdin ended: a well-behaved server would exit now
            time.sleep(60)


if __name__ == "__main__":
    main()
