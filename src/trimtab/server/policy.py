"""`HostPolicy`: what a server's clients may make its host do, beyond driving sessions
(spec S11-S15).

Over stdio the client is the user who started the server, as with the Copilot CLI: it may
have the server run the commands it names, read any file it attaches, reach any host. A
socket's client is whoever holds a token: by default it drives sessions and nothing more, and
the operator allows the rest with flags. One object, made from the server's options, answers
for every path a client has to the host: a session's create and resume (its MCP servers, its
provider), a send's attachments, and the built-in tools (`allows_builtin_tools`). A refusal
is a `PolicyRefusedError` naming the policy and the flag that would allow it, raised before
anything is stored.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from trimtab._errors import PolicyRefusedError
from trimtab._options import SessionOptions
from trimtab.providers import ProviderConfig
from trimtab.server.options import ServerOptions

__all__ = ["HostPolicy"]

_ALL_COMMANDS = "--allow-mcp-commands"
_SOME_COMMANDS = "--mcp-command"
_FILES = "--attachments-root"
_HOSTS = "--allowed-host"

_LOADER_VARIABLES = frozenset(
    {
        "PATH",
        "BASH_ENV",
        "ENV",
        "GCONV_PATH",
        "JAVA_TOOL_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "_JAVA_OPTIONS",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "RUBYLIB",
        "RUBYOPT",
    }
)
_LOADER_PREFIXES = ("LD_", "DYLD_", "PYTHON")
"""Environment variables that change what code a command loads (the dynamic loader's, the
shells' and the usual interpreters'): with them, a command the operator allowed would run
code the client chose. A client's MCP config for an allowed command may not set them."""


class HostPolicy(BaseModel):
    """What clients of one server may make its host do (`of(options)` builds it)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    mcp_commands: Literal["all", "none", "listed"]
    """Local MCP servers the clients name: run any command, none, or those listed."""
    mcp_allowed: frozenset[str] = frozenset()
    """The real paths of the executables `--mcp-command` names."""
    files: Literal["any", "none", "root"]
    """Files the clients name (attachments, a local provider's weights): read any, none, or
    those inside `files_root`."""
    files_root: Path | None = None
    """`--attachments-root`, resolved."""
    allowed_hosts: tuple[str, ...] = ()
    """Hosts that URLs the clients name may reach (`*.` for subdomains); empty: any."""
    builtin_tools: bool
    """Whether the built-in tools (files, shell) may run for this server's clients."""

    @classmethod
    def of(cls, options: ServerOptions) -> HostPolicy:
        """The policy `options` set: stdio's client may do what its user does, a socket's
        what the flags allow. A flag given restricts stdio too (`--mcp-command`,
        `--attachments-root`, `--allowed-host`).

        Raises:
            ValueError: A `--mcp-command` that names no executable, or an
                `--attachments-root` that is no directory.
        """
        socket = not options.stdio
        commands: Literal["all", "none", "listed"]
        if options.mcp_command:
            commands = "listed"
        elif options.allow_mcp_commands or not socket:
            commands = "all"
        else:
            commands = "none"
        allowed = frozenset(map(_allowed_executable, options.mcp_command))
        root = _root(options.attachments_root) if options.attachments_root else None
        files: Literal["any", "none", "root"] = (
            "root" if root is not None else "none" if socket else "any"
        )
        return cls(
            mcp_commands=commands,
            mcp_allowed=allowed,
            files=files,
            files_root=root,
            allowed_hosts=tuple(map(_allowed_host, options.allowed_host)),
            builtin_tools=not socket if options.builtin_tools is None else options.builtin_tools,
        )

    # --- sessions --------------------------------------------------------------------------

    def check_session(self, options: SessionOptions) -> SessionOptions:
        """The options of a session's create or resume as this server may run them: a local
        MCP server's command by the path of the file that was allowed, a local provider's
        weights by their resolved path.

        Raises:
            PolicyRefusedError: An MCP server, or a provider, the policy refuses.
            ValueError: A config that is invalid anyway.
        """
        update: dict[str, Any] = {}
        if isinstance(provider := options.provider, Mapping):
            update["provider"] = self._provider(provider)
        if servers := options.mcp_servers:
            update["mcp_servers"] = self._mcp_servers(servers)
        return options.model_copy(update=update) if update else options

    def _provider(self, provider: Mapping[str, Any]) -> dict[str, Any]:
        config = ProviderConfig.model_validate(provider)
        checked = dict(provider)
        if config.base_url is not None:
            self.check_url(config.base_url, "the provider's base_url")
        if config.model_path is not None:
            path = self.check_path(
                Path(config.model_path).expanduser(), "the provider's model_path"
            )
            for key in ("model_path", "modelPath"):
                if key in checked:
                    checked[key] = str(path)
        return checked

    def _mcp_servers(self, servers: Mapping[str, Any]) -> dict[str, Any]:
        from trimtab.mcp import RemoteServerConfig, parse_servers

        checked: dict[str, Any] = {}
        for name, config in parse_servers(servers).items():
            raw = dict(servers[name])
            if isinstance(config, RemoteServerConfig):
                self.check_url(config.url, f"MCP server {name!r}'s url")
            else:
                raw["command"] = self._command(
                    name, config.command, config.env, config.working_directory
                )
            checked[name] = raw
        return checked

    def _command(self, server: str, command: str, env: Mapping[str, str], cwd: str | None) -> str:
        """The command to run for a client's MCP server `server`, or a refusal."""
        if self.mcp_commands == "all":
            return command
        if self.mcp_commands == "none":
            raise PolicyRefusedError(
                "mcp_commands",
                f"{_ALL_COMMANDS}, or {_SOME_COMMANDS} {os.path.basename(command)}",
                f"MCP server {server!r} would run {command!r} on the server's host, and this"
                " server runs no command its clients name",
            )
        found = _executable(command, cwd)
        if found is None or os.path.realpath(found) not in self.mcp_allowed:
            raise PolicyRefusedError(
                "mcp_commands",
                _SOME_COMMANDS,
                f"MCP server {server!r}: {command!r} is not among the commands this server"
                " runs for its clients",
            )
        if steering := sorted(name for name in env if _steers_loading(name)):
            raise PolicyRefusedError(
                "mcp_commands",
                _ALL_COMMANDS,
                f"MCP server {server!r}: its env sets {steering[0]}, which changes what an"
                " allowed command loads and runs",
            )
        return found  # by its path: nothing the client sets can make it another file

    # --- files and hosts -------------------------------------------------------------------

    def check_path(self, path: Path, what: str) -> Path:
        """The path to read for a file a client named: resolved (symlinks followed) and
        inside the root when there is one; as given when any file may be read.

        Raises:
            PolicyRefusedError: No file may be read, or this one is outside the root.
        """
        if self.files == "any":
            return path
        if self.files == "none" or self.files_root is None:
            raise PolicyRefusedError(
                "files",
                f"{_FILES} DIR",
                f"{what} {path}: this server reads no file for its clients",
            )
        resolved = path.resolve()
        if not resolved.is_relative_to(self.files_root):
            raise PolicyRefusedError(
                "files",
                _FILES,
                f"{what} {path} is outside the directory this server reads its clients' files from",
            )
        return resolved

    def open(self, path: Path, flags: int, what: str) -> int:
        """A descriptor of the file a client named (`check_path`), opened with `flags`.

        Inside a root, the path is opened as resolved, without following a symlink at its
        end, and the file opened is checked to be inside the root still: a symlink put in
        its way after the check is refused, not followed.

        Raises:
            PolicyRefusedError: As `check_path`, or the file moved outside the root.
            OSError: The file cannot be opened.
        """
        target = self.check_path(path, what)
        if self.files_root is None:
            return os.open(target, flags)
        fd = os.open(target, flags | getattr(os, "O_NOFOLLOW", 0))
        try:
            if not _inside(fd, target, self.files_root):
                raise PolicyRefusedError(
                    "files", _FILES, f"{what} {path} moved outside the directory while opened"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_url(self, url: str, what: str) -> None:
        """Refuse a URL a client named whose host `--allowed-host` does not list.

        Raises:
            PolicyRefusedError: Hosts are listed, and this one is not among them.
        """
        if not self.allowed_hosts:
            return
        host = _host(urlsplit(url).hostname or "")
        if not any(_matches(host, allowed) for allowed in self.allowed_hosts):
            raise PolicyRefusedError(
                "hosts",
                _HOSTS,
                f"{what} reaches {host!r}, which is not among the hosts this server's"
                " clients may reach",
            )

    # --- built-in tools --------------------------------------------------------------------

    def allows_builtin_tools(self) -> bool:
        """Whether sessions of this server's clients may have the built-in tools (reading
        and editing files, running commands on the host): over stdio yes, over a socket only
        when the operator allows it."""
        return self.builtin_tools


def _steers_loading(name: str) -> bool:
    return name in _LOADER_VARIABLES or name.startswith(_LOADER_PREFIXES)


def _executable(command: str, cwd: str | None) -> str | None:
    """The absolute path of the file `command` runs: a path (relative ones from `cwd`, as
    the server would start it), or a name found on this server's own `PATH`."""
    if os.sep in command or (os.altsep and os.altsep in command):
        path = Path(cwd or os.getcwd(), command)  # an absolute command stays itself
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(command)
    return os.path.abspath(found) if found is not None else None


def _allowed_executable(entry: str) -> str:
    found = _executable(entry, None)
    if found is None:
        raise ValueError(f"--mcp-command {entry!r} names no executable file (on PATH or as a path)")
    return os.path.realpath(found)


def _root(directory: Path) -> Path:
    try:
        resolved = directory.expanduser().resolve(strict=True)
    except OSError as exc:
        raise ValueError(f"--attachments-root {directory}: {exc.strerror}") from None
    if not resolved.is_dir():
        raise ValueError(f"--attachments-root {directory} is not a directory")
    return resolved


def _host(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


def _allowed_host(entry: str) -> str:
    host = _host(entry)
    name = host.removeprefix("*.")
    if not name or any(c in name for c in "/@*?# ") or (":" in name and not _is_ip(name)):
        raise ValueError(
            f"--allowed-host {entry!r} is not a host: give its name or address alone, such as"
            " api.openai.com, 10.0.0.5 or *.example.com"
        )
    return host


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _matches(host: str, allowed: str) -> bool:
    if allowed.startswith("*."):
        return host.endswith(allowed[1:])
    return host == allowed


def _inside(fd: int, target: Path, root: Path) -> bool:
    """Whether the file open on `fd` is inside `root`: by the kernel's name for it where
    there is one (Linux), else by being the file `target` names now."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(root)
    except OSError:
        opened, named = os.fstat(fd), os.stat(target)
        return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
