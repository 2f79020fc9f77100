"""A client of `trimtab serve` over a raw TCP socket: frames written and read by hand, so that
a test can misbehave in ways no real client library would (stall, flood, never read)."""

from __future__ import annotations

import itertools
import json
import select
import socket
import time
from typing import Any

import pytest

from trimtab.protocol.framing import encode_frame

TIMEOUT = 30.0


class RawClient:
    """One TCP connection to a server on 127.0.0.1, speaking JSON-RPC frames by hand."""

    def __init__(self, port: int, *, token: str | None = None, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buffer = b""
        self._ids = itertools.count(1)
        self.notifications: list[dict[str, Any]] = []
        if token is not None:
            self.result("connect", {"token": token})

    def close(self) -> None:
        self.sock.close()

    def send(self, message: Any) -> None:
        """Send one frame; `message` is JSON-encoded unless it is bytes already."""
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.sock.sendall(encode_frame(body))

    def receive(self) -> dict[str, Any] | None:
        """The next frame, or None once the server closed the connection."""
        while True:
            header, sep, rest = self._buffer.partition(b"\r\n\r\n")
            if sep:
                length = int(header.split(b":")[1])
                if len(rest) >= length:
                    self._buffer = rest[length:]
                    frame: dict[str, Any] = json.loads(rest[:length])
                    return frame
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and return its response (notifications meanwhile are kept)."""
        request_id = next(self._ids)
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
        return self.response(request_id)

    def response(self, request_id: Any) -> dict[str, Any]:
        """The response to `request_id` (or an error the server could not tie to a request),
        keeping the notifications that come before it."""
        while True:
            frame = self.receive()
            if frame is None:
                raise ConnectionError(
                    f"the server closed the connection before answering {request_id}"
                )
            if "method" in frame:
                self.notifications.append(frame)
            elif frame.get("id") in (request_id, None):
                return frame

    def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """The result of a request that must succeed."""
        answer = self.request(method, params)
        assert "result" in answer, answer
        return answer["result"]

    def closed_by_server(self, within: float) -> bool:
        """Whether the server closes the connection within `within` seconds (anything it sends
        before closing is read and dropped)."""
        deadline = time.monotonic() + within
        self.sock.settimeout(0.2)
        try:
            while time.monotonic() < deadline:
                try:
                    if not self.sock.recv(65536):
                        return True
                except TimeoutError:
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    return True
            return False
        finally:
            self.sock.settimeout(TIMEOUT)


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (`VmRSS`) or its peak (`VmHWM`), in KiB, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def unestablished(port: int, count: int, *, within: float = 5.0) -> int:
    """Open `count` connections to 127.0.0.1:`port` at once, without the server accepting any
    (the caller keeps it busy); how many of them have no completed handshake after `within`
    seconds. The kernel completes them while they fit the listening socket's accept queue."""
    with open("/proc/sys/net/core/somaxconn") as limit:
        if int(limit.read()) < count:
            pytest.skip("the kernel caps every accept queue below the burst")
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
        deadline = time.monotonic() + within
        waiting = set(sockets)
        while waiting and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(waiting)[:500], [], 0.2)
            waiting -= {
                s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            }
        return len(waiting)
    finally:
        for sock in sockets:
            sock.close()
