"""`SessionHost`: the store and the `Client` a command works with, and how it opens sessions
(which provider, model and tools) from the resolved configuration.

The provider a command builds from its flags, variables and config file is the person's own:
it gets API keys from the environment even for a `--base-url` (spec S1). A session resumed
without a provider named rebuilds its own from its log, and gets no such key for a base URL.
"""

from __future__ import annotations

import math
import os
import socket
import sqlite3
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trimtab import (
    Client,
    Event,
    Session,
    SessionNotFoundError,
    Tool,
    builtin_tools,
)
from trimtab.builtin import BUILTIN_TOOLS
from trimtab.cli.config import Resolved
from trimtab.cli.demo_tools import DEMO_TOOL_NAMES, demo_tools
from trimtab.cli.errors import EXIT_USAGE, CliError
from trimtab.cli.render import Terminal
from trimtab.cli.runtime import Portal, TerminalBridge
from trimtab.cli.select import ProviderChoice, choose_provider, provider_spec, timeouts
from trimtab.cli.status import TAIL, Status, session_status
from trimtab.events import SessionConfigData, SessionResumeEvent, SessionStartEvent
from trimtab.providers import Provider, ProviderConfig, make_provider
from trimtab.store import MemoryStore, SessionRecord, Store, open_store

if TYPE_CHECKING:
    # Not imported at run time: it brings in the testing helpers, for a hidden provider.
    from trimtab.cli.script import CliScriptedModel

__all__ = ["SessionHost", "in_use", "persisted_config", "store_file"]

_REBUILDABLE = frozenset({"openai", "azure", "anthropic", "local"})
"""Provider types a resumed session can rebuild from its log (credentials from the
environment); anything else, such as an in-process provider, must be chosen again."""

_LIST_HINT = "see 'trimtab sessions list'"


class SessionHost:
    """One store and one `Client` on the portal's loop, for the length of a command.

    ```python
    with Portal(term) as portal, SessionHost(portal, resolved, term) as host:
        session = host.create(bridge)
    ```

    With `read_only`, the store must exist already: a command that only reads creates no
    directory and no database. A store named explicitly that does not exist is an error; the
    default one not existing yet just means that there are no sessions.
    """

    def __init__(
        self,
        portal: Portal,
        resolved: Resolved,
        term: Terminal,
        env: Mapping[str, str] | None = None,
        *,
        read_only: bool = False,
    ) -> None:
        self._portal = portal
        self._resolved = resolved
        self._term = term
        self._env = os.environ if env is None else env
        self._read_only = read_only
        self._store: Store | None = None
        self._client: Client | None = None
        self._choice: ProviderChoice | None = None
        self._spec: dict[str, Any] | Provider | None = None
        self._scripts: list[CliScriptedModel] = []

    def __enter__(self) -> SessionHost:
        config = self._resolved.config
        try:
            self._store = self._portal.call(self._open_store())
        except ValueError as exc:
            raise CliError(
                str(exc), hint="fix --store or TRIMTAB_STORE", exit_code=EXIT_USAGE
            ) from None
        except (OSError, sqlite3.Error) as exc:
            where = config.store or str(config.home / "trimtab.db")
            raise CliError(
                f"cannot open the session store {where}: {exc}",
                hint="check --store, TRIMTAB_STORE or TRIMTAB_HOME",
            ) from None
        # The command line chooses the provider itself (`choice`), in its own words.
        self._client = Client(store=self._store, provider=None)
        self._portal.call(self._client.start())
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._client is not None:
                self._portal.call(self._client.stop())
        finally:
            if self._store is not None:
                self._portal.call(self._store.close())
        unused = sum(script.remaining for script in self._scripts)
        if unused:
            self._term.note(f"trimtab: {unused} step(s) of the --script file were not used")

    async def _open_store(self) -> Store:
        config = self._resolved.config
        file = store_file(config.store, config.home)
        if self._read_only and file is not None and not file.exists():
            if config.store is not None:
                raise CliError(
                    f"there is no session store at {file}",
                    hint="check --store or TRIMTAB_STORE; reading never creates one",
                )
            return MemoryStore()  # nothing stored yet, and nothing to create for reading
        return open_store(config.store, home=str(config.home))

    @property
    def client(self) -> Client:
        """The runtime."""
        assert self._client is not None, "use the host as a context manager"
        return self._client

    @property
    def store(self) -> Store:
        """Where the sessions live."""
        assert self._store is not None, "use the host as a context manager"
        return self._store

    # --- provider --------------------------------------------------------------------------

    def choice(self) -> ProviderChoice:
        """The provider for new sessions; an automatic choice is announced once."""
        if self._choice is None:
            self._choice = choose_provider(self._resolved, self._env)
            if self._choice.auto:
                self._term.note(self._choice.notice())
        return self._choice

    def _provider_options(self, choice: ProviderChoice) -> dict[str, Any]:
        # One provider for every session of the command: a script is read once, so a chat's
        # /new or /resume goes on with its next step rather than starting it over.
        if self._spec is None:
            spec = provider_spec(choice, self._resolved.config)
            if choice.name == "scripted":
                self._scripts.append(cast("CliScriptedModel", spec))
            self._spec = spec if isinstance(spec, Provider) else self._build(choice, spec)
        return {"provider": self._spec, "model": choice.model}

    def _build(self, choice: ProviderChoice, spec: dict[str, Any]) -> Provider:
        """The provider of `spec`, the person's own: API keys of the environment go with it."""
        try:
            provider = make_provider(ProviderConfig.model_validate(spec), env_credentials=True)
        except (ValueError, ImportError) as exc:
            raise _unavailable(choice.name, exc) from None
        if choice.name == "local" and self._resolved.config.model is None:
            from trimtab.providers.local import WEIGHTS_COMMAND, default_model_path

            if default_model_path() is None:
                raise CliError(
                    "the embedded model has no weights: its default model is not installed",
                    hint=f"{WEIGHTS_COMMAND}, or pass --model with the path of a GGUF file",
                )
        return provider

    # --- sessions --------------------------------------------------------------------------

    def create(self, bridge: TerminalBridge) -> Session:
        """A new session with the configured provider, model, tools and system message."""
        choice = self.choice()
        config = self._resolved.config
        options = {
            **self._provider_options(choice),
            **self._common_options(bridge, config.tools),
            "max_turns": config.max_turns,
            "mcp_servers": config.mcp_servers or None,
            "system_message": config.system_message or None,
        }
        session = self._open_session(
            self.client.create_session(**options), choice.name, f"starting {choice.name}"
        )
        bridge.attach(session)
        return session

    def resume(self, wanted: str | None, bridge: TerminalBridge) -> Session:
        """Reopen a session by id or id prefix (None: the most recently active one).

        Without a configured provider the session keeps its own, rebuilt from its log.
        """
        session_id = self.find(wanted) if wanted else self._last_session_id()
        record = self._portal.call(self.store.get(session_id))
        if record.lease_owner is not None:
            raise in_use(session_id, record)
        status = self.status(record)
        persisted = persisted_config(self._portal.call(self.store.read(session_id)))
        given, provider = self._resume_provider(persisted)
        resolved = self._resolved
        tools = resolved.config.tools
        if not resolved.is_set("tools") and persisted.tools:
            # Resumed without --tools: the session keeps the set it was created with.
            names = {tool.name for tool in persisted.tools}
            tools = "demo" if names <= DEMO_TOOL_NAMES else tools
            tools = "builtin" if names <= set(BUILTIN_TOOLS) else tools
        options = {
            **given,
            **self._common_options(bridge, tools),
            # Else the session keeps its own.
            "max_turns": resolved.config.max_turns if resolved.is_set("max_turns") else None,
            "mcp_servers": resolved.config.mcp_servers or None,
        }
        session = self._open_session(
            self.client.resume_session(session_id, **options), provider, "resuming"
        )
        if session.is_remote:
            self._portal.call(session.disconnect())
            raise in_use(session_id, self._portal.call(self.store.get(session_id)))
        if status == "interrupted":
            self._term.note(
                f"trimtab: the last turn of session {session_id} was interrupted: the process"
                " running it stopped before the turn ended"
            )
        bridge.attach(session)
        return session

    def _resume_provider(self, persisted: SessionConfigData) -> tuple[dict[str, Any], str]:
        """The provider options of a resume, and the provider's name for messages."""
        resolved = self._resolved
        provider_type = str((persisted.provider or {}).get("type"))
        if provider_type in _REBUILDABLE and not (
            resolved.is_set("provider") or resolved.is_set("base_url")
        ):
            options: dict[str, Any] = {"model": resolved.config.model}
            if resolved.is_set("timeout") and provider_type != "local":
                options["provider"] = {**(persisted.provider or {}), **timeouts(resolved.config)}
            return options, provider_type
        choice = self.choice()
        return self._provider_options(choice), choice.name

    @staticmethod
    def _common_options(bridge: TerminalBridge, tools: str) -> dict[str, Any]:
        # Tools are code, not logged: they are passed on every open. An empty list also tells
        # a resumed session not to offer the model tools this process cannot run.
        chosen: list[Tool] = []
        if tools == "demo":
            chosen = demo_tools()
        elif tools == "builtin":
            chosen = [*builtin_tools(os.getcwd())]
        return {
            "tools": chosen,
            "on_permission_request": bridge.permission_handler,
            "streaming": True,
        }

    def _open_session(self, opening: Any, provider: str, progress: str) -> Session:
        try:
            session: Session = self._portal.call(opening, progress=progress)
        except ImportError as exc:
            if exc.name == "mcp":  # the MCP servers' SDK, not the provider's
                raise self._no_mcp() from None
            raise _unavailable(provider, exc) from None
        except ValueError as exc:
            raise _unavailable(provider, exc) from None
        return session

    def _no_mcp(self) -> CliError:
        from trimtab.providers._install import install_command

        where = self._resolved.sources.get("mcp_servers", "--mcp")
        drop = "run without --mcp" if where == "--mcp" else f"remove [mcp_servers] from {where}"
        return CliError(
            f"MCP servers ({where}) need the mcp package",
            hint=f"install it with {install_command('mcp')}, or {drop}",
        )

    def find(self, given: str) -> str:
        """The id of the one session whose id is or starts with `given`.

        Raises:
            CliError: No session, or several, match.
        """
        try:
            return self._portal.call(self.store.get(given)).session_id
        except SessionNotFoundError:
            pass
        matches = [r.session_id for r in self.records() if r.session_id.startswith(given)]
        if not matches:
            raise CliError(f"no session with id {given!r}", hint=_LIST_HINT)
        if len(matches) > 1:
            raise CliError(f"{given!r} matches {len(matches)} sessions", hint="type more of the id")
        return matches[0]

    def records(self) -> list[SessionRecord]:
        """Every session, most recently active first."""
        return self._portal.call(self.client.list_sessions())

    def events(self, session_id: str, after: int = 0) -> list[Event]:
        """A session's stored events after the first `after`."""
        return self._portal.call(self.store.read(session_id, after=after))

    def status(self, record: SessionRecord) -> Status:
        """The session's state (see `trimtab.cli.status`), from the tail of its log."""
        tail = self.events(record.session_id, after=max(0, record.event_count - TAIL))
        held = record.lease_owner is not None and _dead_holder(record.lease_owner) is None
        return session_status(tail, held=held)

    def _last_session_id(self) -> str:
        """The most recently active session that holds a conversation."""
        for record in self.records():
            if record.summary is not None:  # its first user message
                return record.session_id
        raise CliError("there is no session to resume", hint="start one with 'trimtab chat'")


def store_file(spec: str | None, home: Path) -> Path | None:
    """The SQLite file a store spec names (as `open_store` reads it), or None for another
    kind of store."""
    if spec is None:
        return home / "trimtab.db"
    if spec == "memory" or ("://" in spec and not spec.startswith("sqlite:///")):
        return None
    return Path(spec.removeprefix("sqlite:///")).expanduser()


def persisted_config(events: list[Event]) -> SessionConfigData:
    """A session's configuration as its log last recorded it."""
    config = SessionConfigData()
    for event in events:
        if isinstance(event, SessionStartEvent):
            config = event.data.config
        elif isinstance(event, SessionResumeEvent) and event.data.config is not None:
            config = event.data.config
    return config


def in_use(session_id: str, record: SessionRecord, *, forceable: bool = False) -> CliError:
    """Why the session cannot be used here: another process holds it, or held it and died.
    `forceable`: the command takes `--force` to go ahead anyway."""
    force = ", or pass --force" if forceable else ""
    expires = _seconds_left(record)
    dead = _dead_holder(record.lease_owner)
    if dead is not None:
        return CliError(
            f"session {session_id} was held by process {dead}, which has exited;"
            f" its lease expires in {expires} s",
            hint=f"try again in {expires} s{force}",
        )
    return CliError(
        f"session {session_id} is in use by {record.lease_owner}",
        hint=f"close it there first{force}; a process that crashed lets go of it within"
        f" {expires} s",
    )


def _seconds_left(record: SessionRecord) -> int:
    if record.lease_expires_at is None:
        return 0
    left = (record.lease_expires_at - datetime.now(UTC)).total_seconds()
    return max(0, math.ceil(left))


def _dead_holder(owner: str | None) -> int | None:
    """The process id of a lease holder on this machine that no longer runs, if it is one.

    A runtime's lease owner is `host:pid:tag`; a holder on another machine cannot be checked.
    """
    host, _, rest = (owner or "").rpartition(":")[0].rpartition(":")
    if host != socket.gethostname() or not rest.isdigit():
        return None
    pid = int(rest)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except PermissionError:
        return None  # it runs, as another user
    return None


def _unavailable(provider: str, exc: Exception) -> CliError:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if provider == "local":
        from trimtab.providers._install import install_command

        hint = f"install it with {install_command('local')}, or choose another --provider"
    else:
        hint = "choose another provider with --provider (see 'trimtab config')"
    return CliError(f"cannot use provider {provider}: {message}", hint=hint)
