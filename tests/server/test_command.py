"""`trimtab serve`'s command line (issues 33 and 35): flags made from `ServerOptions`, the
provider names of `trimtab run`, a port in use, and the hint a session without a provider
gets."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from copilot import CopilotClient
from copilot._jsonrpc import JsonRpcError
from copilot.session import PermissionHandler
from pydantic import Field

from tests.requirements import LLAMA_CPP, unmet
from tests.server.conftest import ServerProcess, StartServer
from trimtab.providers import ProviderConfig
from trimtab.server import ServerOptions
from trimtab.server.command import SDK_FLAGS, serve_command


def _trimtab_serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`trimtab serve ARGS` (as `python -m trimtab`), expected to stop by itself."""
    return subprocess.run(
        [sys.executable, "-m", "trimtab", "serve", "--store", "memory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TRIMTAB_HOME": str(tmp_path)},
    )


# --- one options model ---------------------------------------------------------------------


def test_s4_every_field_of_server_options_is_a_flag_with_its_docs() -> None:
    options = {param.name: param for param in serve_command.params}
    for name, field in ServerOptions.model_fields.items():
        flag = options.pop(name)
        assert isinstance(flag, click.Option)
        assert flag.opts == ["--" + name.replace("_", "-")]
        assert flag.help and flag.help == field.description
        assert flag.default == field.default
    sdk_flags = {flag.flag.lstrip("-").replace("-", "_") for flag in SDK_FLAGS}
    assert set(options) == {"log_level"} | sdk_flags


def test_s4_a_field_added_to_the_model_is_a_checked_flag() -> None:
    class WithPolicy(ServerOptions):
        max_sessions: int = Field(default=10, ge=1)
        """Sessions open at once."""
        allowed_origins: list[str] = []
        """Origins a browser client may connect from (a flag given once per origin)."""

    from trimtab.server import command

    params: list[click.Parameter] = [
        command._option(name, field) for name, field in WithPolicy.model_fields.items()
    ]
    args = ["--max-sessions", "3", "--allowed-origins", "a", "--allowed-origins", "b"]
    parsed = click.Command("serve", params=params).make_context("serve", args)
    given = {k: v for k, v in parsed.params.items() if k in ("max_sessions", "allowed_origins")}
    options = WithPolicy.model_validate(given)
    assert options.max_sessions == 3 and options.allowed_origins == ["a", "b"]
    unset = click.Command("serve", params=params).make_context("serve", [])
    assert unset.params["allowed_origins"] == ()
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        WithPolicy.model_validate({"max_sessions": "0"})


def test_options_are_frozen_and_keep_the_token_out_of_their_repr() -> None:
    options = ServerOptions(token="s3cret", store=Path("sessions.db"))
    assert options.store == "sessions.db" and options.token_value == "s3cret"
    assert "s3cret" not in repr(options)
    with pytest.raises(ValueError, match="frozen"):
        options.port = 1  # type: ignore[misc]
    assert ServerOptions(token="").token is None  # spec S2


# --- --provider: the names of `trimtab run` ------------------------------------------------


@pytest.mark.parametrize(
    ("given", "config"),
    [
        ("openai", {"type": "openai"}),
        ("anthropic", {"type": "anthropic"}),
        (
            "ollama",
            {"type": "openai", "base_url": "http://127.0.0.1:11434/v1", "api_key": "ollama"},
        ),
        ("local", {"type": "local"}),
        (
            ' {"type": "openai", "baseUrl": "http://h:1/v1"} ',
            {"type": "openai", "base_url": "http://h:1/v1"},
        ),
    ],
)
def test_s9_provider_takes_the_names_of_trimtab_run(given: str, config: dict[str, Any]) -> None:
    assert ServerOptions(provider=given).provider == ProviderConfig.model_validate(config)


@pytest.mark.parametrize("given", ["Local", "gpt-4", "[]", "", '"openai"'])
def test_s9_provider_refuses_what_is_neither_a_name_nor_a_json_object(given: str) -> None:
    with pytest.raises(ValueError, match="expected openai, anthropic, ollama, local, or a JSON"):
        ServerOptions(provider=given)


def test_s9_serve_provider_local_starts_the_embedded_model(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        done = _trimtab_serve(tmp_path, "--provider", "local")
        # Not "not JSON": the name is understood, and the missing library is said once.
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr.startswith("error: provider type 'local' needs llama-cpp-python")
        unmet(LLAMA_CPP)
    server = ServerProcess(tmp_path / "local.db", "--provider", "local")
    try:
        client = server.raw()
        client.result("session.create", {"sessionId": "s"})
        events = client.result("session.getMessages", {"sessionId": "s"})["events"]
        client.close()
        start = next(e for e in events if e["type"] == "session.start")
        assert start["data"]["config"]["provider"]["type"] == "local"
    finally:
        assert server.stop() == 0, server.log.read_text()


# --- S7: a session with no provider on a server without one --------------------------------


async def test_s7_a_copilot_client_without_a_provider_is_told_of_serve_provider(
    start_server: StartServer,
) -> None:
    server = start_server(None)
    client = CopilotClient(connection=server.connection())
    await client.start()
    try:
        with pytest.raises(JsonRpcError) as refused:
            await client.create_session(on_permission_request=PermissionHandler.approve_all)
    finally:
        await client.force_stop()
    message = refused.value.message
    assert "trimtab serve --provider NAME" in message and "Client()" not in message, message


# --- S4: a port in use ---------------------------------------------------------------------


def test_s4_a_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _trimtab_serve(tmp_path, "--port", str(port))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: port {port} is in use",
        "hint: pick another with --port, or --port 0 for a free one",
    ]
