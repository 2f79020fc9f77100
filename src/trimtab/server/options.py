"""`ServerOptions`: every setting of a server, validated in one model.

`serve(options)` takes it, and `trimtab serve` builds its flags from it: each field is a
flag of the same name (`max_connections` is `--max-connections`), its docstring the flag's
help and its default the flag's, so that a new field is a new flag.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from trimtab.providers import PROVIDER_NAMES, ProviderConfig, named_provider
from trimtab.store import DEFAULT_TIMEOUT

__all__ = ["PENDING_TIMEOUT", "Flag", "ServerOptions"]

PENDING_TIMEOUT = 120.0
"""Default seconds the tool calls of a client whose connection dropped wait for a client that
resumes the session to answer them (spec D6)."""


@dataclass(frozen=True, slots=True)
class Flag:
    """How a field reads as a flag, beyond what its type says (in its `Annotated` metadata)."""

    metavar: str
    """The placeholder for its value in `--help`: `SECONDS`, `N`, ..."""


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False), Flag("SECONDS")]
"""A duration: positive and finite (spec W3), or a wait it bounds would never end."""

Count = Annotated[int, Field(ge=1), Flag("N")]

_KEY_FILE_KEYS = frozenset({"api_key_file", "apiKeyFile"})


class ServerOptions(BaseModel):
    """How a server listens, where its sessions live and what bounds each connection.

    Invalid settings raise `pydantic.ValidationError` (a `ValueError`) when the options are
    made, before anything is opened: a limit that is not positive, a port out of range, a
    provider that is no config, an address beyond loopback without a token, flags that
    contradict each other.
    """

    # Built on first use, as the other models are: a server's start-up builds it once.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        defer_build=True,
        hide_input_in_errors=True,
    )

    host: Annotated[str, Flag("ADDRESS")] = "127.0.0.1"
    """Address to listen on (TCP). Any but loopback needs a token."""
    port: Annotated[int, Field(ge=0, le=65535), Flag("PORT")] = 0
    """TCP port; 0 picks a free one."""
    stdio: bool = False
    """Speak on stdin and stdout instead of TCP. Nothing but frames is written to stdout
    then: stray writes to it go to stderr."""
    store: Annotated[str | None, Flag("PATH|URL")] = None
    """Session store: 'memory', a SQLite file, sqlite:///URL or postgresql://URL [env
    TRIMTAB_STORE; default: $TRIMTAB_HOME/trimtab.db]."""
    token: Annotated[SecretStr | None, Flag("TOKEN")] = None
    """Connection token clients must send in 'connect' [env COPILOT_CONNECTION_TOKEN, over
    TCP]. Over TCP without one, the server makes one and says in which file it is
    ($TRIMTAB_HOME/serve/PORT.token, readable only by you). On the command line it shows in
    the process list: prefer the variable or --tokens-file."""
    tokens_file: Annotated[Path | None, Flag("FILE")] = None
    """Several clients, a token each: a TOML file of name = "token" lines, readable only by
    you. Each client sees, resumes and deletes only the sessions its token created."""
    admin: Annotated[list[str], Flag("NAME")] = []
    """A name of --tokens-file whose token sees every client's sessions (repeatable)."""
    no_auth: bool = False
    """Accept TCP clients without a token (loopback only): every account of this machine
    can then drive every session, and make the host do what the policy flags below let
    clients do."""
    allow_mcp_commands: bool = False
    """Run any command a TCP client names in mcpServers, as this server's user. Without it
    (or --mcp-command), a TCP client's local MCP servers are refused; a stdio client's run."""
    mcp_command: Annotated[list[str], Flag("COMMAND")] = []
    """Run only this command (repeatable) when a client names it in mcpServers, with the
    arguments the client gives: a name on this server's PATH, or a path; matched by the file
    it resolves to."""
    attachments_root: Annotated[Path | None, Flag("DIR")] = None
    """Read the files and directories clients attach only inside DIR (symlinks resolved).
    Without it a TCP client's file attachments are refused; a stdio client's read."""
    allowed_host: Annotated[list[str], Flag("HOST")] = []
    """A host a client-named provider base_url or MCP server url may reach (repeatable;
    *.example.com for its subdomains). None given: any."""
    provider: Annotated[ProviderConfig | None, Flag("NAME|JSON")] = None
    """Provider of sessions that bring none: openai, anthropic, ollama, local (the embedded
    model), or a JSON config such as '{"type": "openai", "base_url": "..."}'. Only it gets API
    keys from this process's environment for a base URL it names."""
    api_key_file: Annotated[Path | None, Flag("FILE")] = None
    """Read the --provider's API key from FILE (or api_key_file in its JSON), so that it
    need not be in this process's environment."""
    lease_ttl: Seconds = 30.0
    """How long a crashed server's sessions stay locked before another server sharing the
    store takes them over."""
    store_timeout: Seconds = DEFAULT_TIMEOUT
    """Time within which every call of the store completes or fails: a run it holds up ends
    in an error, a request is answered with one (at start the store has 10 s of it)."""
    max_connections: Count = 4096
    """TCP connections served at once; more are refused with SERVER_BUSY."""
    max_output: Annotated[int, Field(ge=1), Flag("BYTES")] = 8 * 1024 * 1024
    """Output a client may leave unread before it is disconnected."""
    max_requests: Count = 1000
    """Requests a client may have in flight; more are refused (-32004)."""
    connect_timeout: Seconds = 5.0
    """Time a TCP client has to send the token, when there is one."""
    idle_timeout: Seconds = 300.0
    """Time a TCP connection with no session and no request may stay open."""
    pending_timeout: Seconds = PENDING_TIMEOUT
    """Time the tool calls a dropped client left unanswered wait for a resuming one."""
    frame_timeout: Seconds = 10.0
    """Time a message's header may take once begun (and longest pause in its body)."""
    builtin_tools: Annotated[bool | None, Flag("on|off")] = None
    """Give sessions the built-in tools (view, create, edit, bash, grep, glob), working in
    this directory or in a session's workingDirectory, which over TCP must be inside
    --attachments-root [default: on over --stdio, off over TCP]."""
    engine: Annotated[str | None, Flag("URL")] = None
    """Run sessions on a durable execution engine, temporal://HOST:PORT[/NAMESPACE], whose
    workers (trimtab worker) run the loop; this server stores inputs, follows the logs and
    asks its clients the runs' questions [env TRIMTAB_ENGINE; needs the temporal extra]."""

    @field_validator("store", mode="before")
    @classmethod
    def _path(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("token")
    @classmethod
    def _empty_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty token would authenticate nobody, nor allow listening beyond loopback (S2).
        return value if value is not None and value.get_secret_value() else None

    @field_validator("engine")
    @classmethod
    def _engine_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("temporal://"):
            raise ValueError(f"an engine is temporal://HOST:PORT[/NAMESPACE], not {value!r}")
        return value or None

    @field_validator("provider", mode="before")
    @classmethod
    def _named_or_json(cls, value: Any) -> Any:
        return provider_argument(value) if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _key_file_of_provider(cls, values: Any) -> Any:
        """A provider config's `api_key_file` (`apiKeyFile`) is `--api-key-file`: a key the
        config names by path, not a field of the provider (a client could name any file)."""
        if not isinstance(values, dict):
            return values
        provider = values.get("provider")
        if isinstance(provider, str):
            try:
                provider = provider_argument(provider)
            except ValueError:
                return values  # said by the field's own check, which names it
        if not isinstance(provider, dict) or not provider.keys() & _KEY_FILE_KEYS:
            return values
        provider = dict(provider)
        paths = {provider.pop(key) for key in _KEY_FILE_KEYS & provider.keys()}
        if len(paths) > 1 or values.get("api_key_file") not in (None, *paths):
            raise ValueError("the provider's api_key_file and --api-key-file differ")
        return {**values, "provider": provider, "api_key_file": paths.pop()}

    @model_validator(mode="after")
    def _loopback_or_token(self) -> ServerOptions:
        has_token = self.token is not None or self.tokens_file is not None
        if self.no_auth and (self.stdio or has_token or not _is_loopback(self.host)):
            raise ValueError(
                "--no-auth is for a TCP server on a loopback address, without --token or"
                " --tokens-file: every account of this machine could drive its sessions"
            )
        if not self.stdio and not has_token and not _is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host!r} without a connection token: anyone who"
                " can reach it could drive your sessions (pass a token, or use 127.0.0.1)"
            )
        if self.token is not None and self.tokens_file is not None:
            raise ValueError("give one token (--token) or a tokens file, not both")
        if self.stdio and self.tokens_file is not None:
            raise ValueError("--tokens-file is for TCP: a stdio client sends no token")
        if self.admin and self.tokens_file is None:
            raise ValueError("--admin names a token of --tokens-file, which is not given")
        if self.allow_mcp_commands and self.mcp_command:
            raise ValueError(
                "--allow-mcp-commands runs every command, --mcp-command only those named:"
                " give one of them"
            )
        if self.api_key_file is not None and self.provider is None:
            raise ValueError("--api-key-file is the key of --provider, which is not given")
        if self.api_key_file is not None and self.provider and self.provider.api_key:
            raise ValueError("the provider has an api_key and an api_key_file: give one")
        return self

    @property
    def token_value(self) -> str | None:
        """The connection token in clear, for the connections only."""
        return self.token.get_secret_value() if self.token is not None else None


def provider_argument(text: str) -> dict[str, Any]:
    """The provider config a name (`ollama`) or a JSON object stands for.

    Raises:
        ValueError: Neither a provider's name nor a JSON object.
    """
    text = text.strip()
    for name in PROVIDER_NAMES:
        if text == name:
            return named_provider(name)
    if text.startswith("{"):
        try:
            config = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if isinstance(config, dict):
            return config
    names = ", ".join(PROVIDER_NAMES)
    raise ValueError(f'expected {names}, or a JSON object such as {{"type": "openai"}}')


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost could resolve anywhere
