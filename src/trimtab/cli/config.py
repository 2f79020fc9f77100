"""`CliConfig`: the command line's settings, resolved into one validated object.

Each setting comes from the first of: a flag, a `TRIMTAB_*` environment variable, the
`trimtab.toml` file (the current directory's, else `$TRIMTAB_HOME/trimtab.toml`), the default.
`resolve` also records where each value came from, which `trimtab config` shows and error
messages name, so that a bad value is traced to the place to fix it.
"""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from trimtab.cli.errors import EXIT_USAGE, CliError, read_input
from trimtab.events import DEFAULT_MAX_TURNS
from trimtab.providers import PROVIDER_NAMES
from trimtab.providers._choice import DEFAULT_OLLAMA_URL

__all__ = [
    "CONFIG_FILE",
    "ENV_NAMES",
    "FLAG_NAMES",
    "PUBLIC_PROVIDERS",
    "CliConfig",
    "ProviderName",
    "Resolved",
    "mcp_flags",
    "resolve",
]

ProviderName: TypeAlias = Literal["openai", "anthropic", "ollama", "local", "scripted"]
"""`scripted` is a testing aid (replies from `--script FILE`), left out of the help."""

PUBLIC_PROVIDERS = PROVIDER_NAMES

CONFIG_FILE = "trimtab.toml"


class CliConfig(BaseModel):
    """Every setting of the command line, validated; unknown keys are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: ProviderName | None = None
    """None: chosen from the environment (see `trimtab.cli.select`)."""
    model: str | None = None
    """None: the chosen provider's default model."""
    base_url: str | None = None
    """The API root of an OpenAI-compatible server; alone, it implies the `openai` type."""
    api_key: SecretStr | None = None
    """Sent to the provider; never printed."""
    store: str | None = None
    """Where sessions live: `memory`, a SQLite path or URL; None is `<home>/trimtab.db`."""
    tools: Literal["none", "demo", "builtin"] = "none"
    """`demo`: the calculator, current_time and clear_context tools; `builtin`: the agent's
    own tools (view, create, edit, bash, grep, glob) in the current directory (spec B10)."""
    script: Path | None = None
    """The replies of the `scripted` provider (JSON or YAML)."""
    system_message: str | None = None
    """The system message of new sessions."""
    mcp_servers: dict[str, dict[str, Any]] = {}
    """MCP servers whose tools sessions get (`--mcp NAME=COMMAND`, the `[mcp_servers]` table),
    in the shapes of `create_session(mcp_servers=...)`."""
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds a model call may wait for data: the provider's `timeout` and `stall_timeout`
    both (None: their defaults, 300 s and 120 s)."""
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    """Model calls one run may make before it ends in a `max_turns` error."""
    ollama_url: str = DEFAULT_OLLAMA_URL
    """Where to look for a local Ollama server when no provider is named."""
    home: Path = Field(default=Path("~/.trimtab"), validate_default=True)
    """trimtab's data directory (`TRIMTAB_HOME`); only the environment sets it."""
    debug: bool = False
    """Show tracebacks of unexpected errors."""

    @field_validator("home", "script")
    @classmethod
    def _expand_user(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("ollama_url", "base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # a port that is not a number from 1 to 65535
            valid = False
        if not valid:
            raise ValueError(
                "expected an http:// or https:// URL, such as http://localhost:8080/v1"
            )
        return value.rstrip("/")

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_servers(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from trimtab.mcp import parse_servers

        parse_servers(value)
        return value

    @property
    def api_key_value(self) -> str | None:
        """The API key in clear, for the provider config only."""
        return self.api_key.get_secret_value() if self.api_key is not None else None


ENV_NAMES = {
    name: f"TRIMTAB_{name.upper()}" for name in CliConfig.model_fields if name != "mcp_servers"
}
"""The environment variable of each setting (a table of servers has none)."""

FLAG_NAMES = {
    "provider": "--provider",
    "model": "--model",
    "base_url": "--base-url",
    "api_key": "--api-key",
    "store": "--store",
    "tools": "--tools",
    "script": "--script",
    "system_message": "--system",
    "timeout": "--timeout",
    "max_turns": "--max-turns",
    "mcp_servers": "--mcp",
    "debug": "--debug",
}
"""The flag of each setting that has one."""

_FILE_KEYS = frozenset(CliConfig.model_fields) - {"home"}
# Relative paths in a config file are relative to the file, not to wherever trimtab runs.
_FILE_PATH_KEYS = ("script", "store")


@dataclass(frozen=True, slots=True)
class Resolved:
    """A resolved configuration and the origin of each value."""

    config: CliConfig
    sources: dict[str, str]
    """Setting -> `--flag`, `TRIMTAB_VAR`, the config file's path, or `default`."""
    config_file: Path | None

    def is_set(self, name: str) -> bool:
        """Whether the person gave this setting (anywhere), rather than its default."""
        return self.sources.get(name, "default") != "default"


def resolve(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Resolved:
    """Merge flags, environment and config file into a `CliConfig`.

    Args:
        flags: Flag values by setting name; None means the flag was not given.
        env: The environment (default `os.environ`); empty variables count as unset.
        cwd: Where to look for `trimtab.toml` first (default: the current directory).

    Raises:
        CliError: A value is invalid, or the config file cannot be read (exit code 2).
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    home = env.get(ENV_NAMES["home"]) or "~/.trimtab"
    config_file = _find_config_file(cwd or Path.cwd(), Path(home).expanduser())
    if config_file is not None:
        for name, value in _read_config_file(config_file).items():
            values[name], sources[name] = value, str(config_file)
    for name, variable in ENV_NAMES.items():
        if env.get(variable):
            values[name], sources[name] = env[variable], variable
    for name, value in flags.items():
        if value is not None:
            if name == "mcp_servers":  # `--mcp` adds servers to the file's table
                value = {**values.get(name, {}), **value}
            values[name], sources[name] = value, FLAG_NAMES.get(name, name)
    try:
        config = CliConfig.model_validate(values)
    except ValidationError as exc:
        raise _invalid(exc, sources) from None
    return Resolved(config, sources, config_file)


def mcp_flags(given: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """The servers of `--mcp NAME=COMMAND` flags (COMMAND split as a shell would), or None.

    Raises:
        CliError: A flag without `=`, a name or a command.
    """
    servers: dict[str, dict[str, Any]] = {}
    for flag in given:
        name, _, command = flag.partition("=")
        try:
            argv = shlex.split(command)
        except ValueError:
            argv = []
        if not name.strip() or not argv:
            raise CliError(
                f"invalid value {flag!r} for --mcp",
                hint="--mcp NAME=COMMAND, such as --mcp files='npx -y "
                "@modelcontextprotocol/server-filesystem .'",
                exit_code=EXIT_USAGE,
            )
        servers[name.strip()] = {"command": argv[0], "args": argv[1:]}
    return servers or None


def _find_config_file(cwd: Path, home: Path) -> Path | None:
    for candidate in (cwd / CONFIG_FILE, home / CONFIG_FILE):
        if candidate.is_file():
            return candidate
    return None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            data = tomllib.loads(read_input(file, str(path)))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CliError(
            f"cannot read {path}: {exc}", hint="fix the file or remove it", exit_code=EXIT_USAGE
        ) from None
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise CliError(
            f"{path}: unknown setting {unknown[0]!r}",
            hint="known settings: " + ", ".join(sorted(_FILE_KEYS)),
            exit_code=EXIT_USAGE,
        )
    for key in _FILE_PATH_KEYS:
        value = data.get(key)
        if isinstance(value, str) and _is_relative_path(value):
            data[key] = str(path.parent / value)
    return data


def _is_relative_path(value: str) -> bool:
    return value != "memory" and "://" not in value and not Path(value).expanduser().is_absolute()


def _invalid(exc: ValidationError, sources: Mapping[str, str]) -> CliError:
    """The first validation error, named after where the bad value came from."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "?"
    origin = sources.get(name, name)
    where = f"{name} in {origin}" if origin.endswith(CONFIG_FILE) else origin
    message = error["msg"]
    if name == "provider":
        # The generated message would list the hidden testing provider too.
        message = "expected one of " + ", ".join(PUBLIC_PROVIDERS)
    given = error.get("input")
    shown = "" if name == "api_key" or isinstance(given, dict) else f" {given!r}"
    return CliError(
        f"invalid value{shown} for {where}: {message}",
        hint="see 'trimtab --help', or 'trimtab config' for the values in force",
        exit_code=EXIT_USAGE,
    )
