"""`Client`: the in-process runtime. It wires the store, providers and defaults, and creates,
resumes, lists and deletes sessions."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import ValidationError

from trimtab import _loop
from trimtab._durations import check_seconds
from trimtab._engine import Engine
from trimtab._errors import SessionNotFoundError, TrimtabError
from trimtab._hooks import Hooks
from trimtab._log import SessionLog, chained
from trimtab._options import SessionOptions, options_of, storable
from trimtab._permissions import PermissionHandlerFn
from trimtab._retention import relocated
from trimtab._session import Session, answer_waiting, ownership_of
from trimtab._state import SessionState, StateSnapshot, state_of
from trimtab._toolbox import Toolbox
from trimtab._tools import Tool, valid_text
from trimtab._tracing import Tracing
from trimtab.events import (
    Event,
    SessionConfigData,
    SessionResumeData,
    SessionResumeEvent,
    SessionStartData,
    SessionStartEvent,
    new_id,
)
from trimtab.providers import Provider, ProviderConfig, make_provider
from trimtab.providers._choice import AutomaticChoice, choose_automatically, ollama_url
from trimtab.store import DEFAULT_TIMEOUT, Lease, SessionRecord, Store, open_store

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from trimtab.mcp import ServerPool
    from trimtab.remote import RemoteClient

__all__ = ["Client"]

log = logging.getLogger("trimtab")


class Client:
    """An in-process trimtab runtime.

    ```python
    async with Client() as client:
        session = await client.create_session(provider={...}, model="gpt-4.1")
    ```

    Args:
        store: where logs live: a `Store`, `"memory"`, a SQLite path, or None for the SQLite
            database under `TRIMTAB_HOME` (default `~/.trimtab`).
        provider: the provider of sessions that name none (a config dict or a `Provider`).
            `"auto"` chooses one from the environment, as the command line does: an OpenAI
            or Anthropic key, a running Ollama, else the embedded model; once per client,
            announced in one line on the `trimtab` logger (spec S6). None: every session
            must name its own. A session resumed without one keeps the provider its log
            names, unless this is a config dict or a `Provider`.
        lease_ttl: seconds a session lease lasts without renewal (spec R1).
        poll_interval: seconds between lease renewals and checks for queued remote input.
        store_timeout: seconds within which every call of the store this client opens
            completes or raises `StoreUnavailableError` (spec W1); a `Store` passed in keeps
            its own `timeout`.
        tracing: emit OpenTelemetry spans of runs, model calls and tool calls once the
            application has loaded OpenTelemetry (spec OT1); None reads `TRIMTAB_TRACING`
            (on unless `0`).
        trace_content: put message contents, tool arguments and results on the spans; None
            reads `TRIMTAB_TRACING_CONTENT` (off unless `1`).
        tracer_provider: the OpenTelemetry `TracerProvider` to use instead of the global one.
        engine: a durable execution engine that runs this client's sessions instead of this
            process (`trimtab.temporal.TemporalEngine`, spec EN1): the client stores inputs,
            follows the logs, and answers the runs' questions with its sessions' tools and
            permission handlers. None: this process runs them, holding their leases.
    """

    def __init__(
        self,
        *,
        store: Store | str | os.PathLike[str] | None = None,
        provider: dict[str, Any] | Provider | Literal["auto"] | None = "auto",
        lease_ttl: float = 30.0,
        poll_interval: float = 1.0,
        store_timeout: float = DEFAULT_TIMEOUT,
        tracing: bool | None = None,
        trace_content: bool | None = None,
        tracer_provider: TracerProvider | None = None,
        engine: Engine | None = None,
    ) -> None:
        check_seconds("lease_ttl", lease_ttl)
        check_seconds("poll_interval", poll_interval)
        check_seconds("store_timeout", store_timeout)
        self._store_spec = store
        self._store_timeout = store_timeout
        self._store: Store | None = None
        if isinstance(provider, str) and provider != "auto":
            raise ValueError(
                f"provider must be a config dict, a Provider, 'auto' or None, not {provider!r}"
            )
        self._default_provider = provider
        self._automatic: AutomaticChoice | None = None
        """The environment's provider, chosen on first need when `provider` is "auto"."""
        self._choosing = asyncio.Lock()
        self._lease_ttl = lease_ttl
        self._poll_interval = poll_interval
        self._tracing = Tracing(tracing, content=trace_content, provider=tracer_provider)
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._sessions: dict[str, Session] = {}
        self._owner_of_sessions = _SessionOwner(self)
        self._providers: dict[str, Provider] = {}
        self._tool_tables: dict[tuple[int, ...], _ToolTable] = {}
        """The tool tables open sessions share, by their tools' ids (`_tool_table`)."""
        self._maintainer: asyncio.Task[None] | None = None
        self._mcp: ServerPool | None = None
        """The MCP servers of this client's sessions, created with the first that has any."""
        self._engine = engine
        self._engine_started = False

    @classmethod
    def connect(
        cls, url: str, *, token: str | None = None, heartbeat: float = 15.0
    ) -> RemoteClient:
        """A client of a runtime in another process (`trimtab serve`), with this API.

        ```python
        async with Client.connect("tcp://127.0.0.1:8765") as client:
            session = await client.create_session(provider={...}, tools=[...])
        ```

        Tools and the permission handler run in the calling process; the loop, the model
        calls and the event log run in the server. `token` is the server's connection token;
        `heartbeat` bounds how long a server that stopped answering holds a call (see
        `RemoteClient`).
        """
        # The remote client is an adapter above this layer: imported only when asked for.
        from trimtab.remote import RemoteClient

        return RemoteClient(url, token=token, heartbeat=heartbeat)

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open the store (and connect to the engine), and start lease upkeep; called by
        `async with` and on first use."""
        if self._store is None:
            self._store = open_store(self._store_spec, timeout=self._store_timeout)
            if self._engine is None:
                # (On an engine this client holds no lease and takes no session over.)
                self._maintainer = asyncio.get_running_loop().create_task(
                    self._maintain(), name="trimtab-leases"
                )
        if self._engine is not None and not self._engine_started:
            await self._engine.start()
            self._engine_started = True

    async def stop(self) -> None:
        """Disconnect every session, then close every provider they used and the store."""
        for session in list(self._sessions.values()):
            try:
                await session.disconnect()
            except Exception:
                # One session's failure must not keep the others (and their leases) open.
                log.exception("session %s did not disconnect cleanly", session.session_id)
        if self._maintainer is not None:
            self._maintainer.cancel()
            await asyncio.wait([self._maintainer])
            self._maintainer = None
        providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            await provider.aclose()
        if self._mcp is not None:
            await self._mcp.close()
        if self._store is not None and not isinstance(self._store_spec, Store):
            await self._store.close()
        self._store = None
        if self._engine is not None and self._engine_started:
            self._engine_started = False
            await self._engine.stop()

    async def _open_store(self) -> Store:
        await self.start()
        assert self._store is not None
        return self._store

    # --- sessions ------------------------------------------------------------------------

    async def create_session(
        self,
        options: SessionOptions | None = None,
        *,
        session_id: str | None = None,
        owner: str | None = None,
        **keywords: Any,
    ) -> Session:
        """Create a session and hold its lease.

        The options are a `SessionOptions`, keywords of its field names, or both (the keywords
        win): `create_session(SessionOptions(model="m"), max_turns=3)`.

        Atomic: options, text and configuration are checked before anything is stored, and a
        create that fails later (a store error) removes what it stored, so the id stays free.
        `owner` names who the session belongs to, in its `session.start` and its store record
        (a server with several tokens records the token's name, spec S16); its forks keep it.
        """
        opts = self._checked(options, keywords)
        session_id = _checked_id(new_id() if session_id is None else session_id)
        if owner is not None:
            owner = _checked_id(owner, "owner")  # a store's key too, as the id
        spec, operators, model = await self._provider_spec(opts.provider)
        if model is not None and opts.model is None:
            opts = opts.model_copy(update={"model": model})
        provider, public = self._provider(spec, operators)
        config = opts.to_config(SessionConfigData(provider=public))
        hooks = Hooks(session_id, opts.hooks)
        config = _started(config, await hooks.session_start("new"))
        start = SessionStartEvent(
            data=SessionStartData(
                session_id=session_id,
                selected_model=config.model,
                reasoning_effort=config.reasoning_effort,
                config=config,
                owner=owner,
            )
        )
        return await self._created(session_id, [start], provider, opts, hooks)

    async def _created(
        self,
        session_id: str,
        events: list[Event],
        provider: Provider,
        opts: SessionOptions,
        hooks: Hooks,
    ) -> Session:
        """A new session whose log is `events` (stored with the session, in one transaction),
        and whose lease this client holds."""
        store = await self._open_store()
        events = chained(events, None, 0)
        await store.create(session_id, events)
        try:
            if self._engine is not None:
                return await self._on_engine(
                    self._session(session_id, store, None, state_of(events), provider, opts, hooks)
                )
            lease = await store.acquire_lease(session_id, self._owner, self._lease_ttl)
            if lease is None:
                raise TrimtabError(f"session {session_id!r} was taken by another runtime")
            return self._session(session_id, store, lease, state_of(events), provider, opts, hooks)
        except BaseException:
            await _undo_create(store, session_id)
            raise

    async def _on_engine(self, session: Session) -> Session:
        """`session`, run by this client's engine from now on: this process follows its log
        and answers its runs' questions (spec EN1, EN6)."""
        assert self._engine is not None
        try:
            await ownership_of(session).follow()
            await self._engine.open_session(session.session_id)
        except BaseException:
            await session.disconnect()
            raise
        answer_waiting(session)
        return session

    async def resume_session(
        self,
        session_id: str,
        options: SessionOptions | None = None,
        *,
        continue_pending_work: bool = False,
        **keywords: Any,
    ) -> Session:
        """Open an existing session by replaying its log (spec P1).

        Options are taken as by `create_session`; those given replace the session's own.
        Tools and the permission handler are not persisted as code: pass them again. When
        another runtime holds the session's lease the session is remote (spec R1). A tool
        call a crash left unfinished is completed as `cancelled`; with
        `continue_pending_work=True` it runs again and the interrupted run goes on (spec P3).
        """
        if (open_session := self._sessions.get(session_id)) is not None:
            if not open_session.closed:
                # Open already: shared as it is (the options are not applied), and its
                # resume logged all the same (spec D5).
                await ownership_of(open_session).reopened(continue_pending=continue_pending_work)
                return open_session
            await open_session.disconnect()  # let it finish closing, then open it anew
        opts = self._checked(options, keywords)
        store = await self._open_store()
        replayed = await _open_state(store, session_id)
        spec, operators, model = await self._provider_spec(opts.provider, replayed.config.provider)
        if model is not None and opts.model is None and replayed.config.model is None:
            opts = opts.model_copy(update={"model": model})
        provider, public = self._provider(spec, operators)
        if self._engine is not None:
            # The engine's workers run it from its log: nothing is logged here, and a
            # configuration given again is not applied (spec EN1).
            hooks = Hooks(session_id, None)
            return await self._on_engine(
                self._session(session_id, store, None, replayed, provider, opts, hooks)
            )
        config = opts.to_config(replayed.config.model_copy(update={"provider": public}))
        lease = await store.acquire_lease(session_id, self._owner, self._lease_ttl)
        hooks = Hooks(session_id, opts.hooks)
        if lease is not None:  # (a session another runtime runs was started there)
            config = _started(config, await hooks.session_start("resume"))
        session = self._session(session_id, store, lease, replayed, provider, opts, hooks)
        if lease is None:
            # Returned once it listens: no live event of the owner's is missed from then on.
            await ownership_of(session).follow()
            return session
        try:
            data = SessionResumeData(
                event_count=replayed.event_count,
                selected_model=config.model,
                reasoning_effort=config.reasoning_effort,
                config=config if config != replayed.config else None,
                continue_pending_work=continue_pending_work,
            )
            await ownership_of(session).resumed(SessionResumeEvent(data=data))
            await ownership_of(session).recover(continue_pending=continue_pending_work)
        except BaseException:
            await session.disconnect()
            raise
        return session

    def _checked(
        self, options: SessionOptions | None, keywords: Mapping[str, Any]
    ) -> SessionOptions:
        """The options, checked (`_checked`); on an engine, without what its workers cannot
        take (spec EN1): hooks and MCP servers run in the process that runs the loop."""
        opts = _checked(options, keywords)
        if self._engine is not None:
            given = [name for name in ("hooks", "mcp_servers") if getattr(opts, name)]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} cannot be given to a session on an engine"
                    f" ({self._engine.name}): its workers run the loop"
                )
        return opts

    async def list_sessions(self) -> list[SessionRecord]:
        """Every stored session, most recently active first."""
        return await (await self._open_store()).list_sessions()

    async def get_session_record(self, session_id: str) -> SessionRecord:
        """One stored session's record, as `list_sessions` gives it, read alone; raises
        `SessionNotFoundError` for an unknown id."""
        return await (await self._open_store()).get(_checked_id(session_id))

    async def delete_session(self, session_id: str) -> None:
        """Disconnect the session if open here, then delete its log."""
        if (session := self._sessions.get(session_id)) is not None:
            await session.disconnect()
        store = await self._open_store()
        await store.get(session_id)  # raises SessionNotFoundError
        await store.delete(session_id)
        if self._engine is not None:
            await self._engine.delete_session(session_id)

    async def _host(
        self,
        session_id: str,
        lease: Lease,
        *,
        tools: Callable[[SessionConfigData], list[Tool]],
        permission_handler: PermissionHandlerFn | None,
    ) -> Session:
        """Open a session to run it under `lease`, for an engine's attempt (spec EN3): as a
        resume by this client would open it, with the `tools` its configuration gets and
        `permission_handler`, but logging nothing yet, and kept by the caller, not by this
        client (the attempt lets it go). The caller finishes what the log left in progress
        (`ownership_of`)."""
        store = await self._open_store()
        replayed = await _open_state(store, session_id)
        spec, operators, _ = await self._provider_spec(None, replayed.config.provider)
        provider, _ = self._provider(spec, operators)
        opts = SessionOptions(
            tools=tools(replayed.config), on_permission_request=permission_handler
        )
        return self._session(
            session_id, store, lease, replayed, provider, opts, Hooks(session_id, None), keep=False
        )

    def _session(
        self,
        session_id: str,
        store: Store,
        lease: Lease | None,
        state: SessionState,
        provider: Provider,
        opts: SessionOptions,
        hooks: Hooks,
        *,
        keep: bool = True,
    ) -> Session:
        """Assemble an opened session, and keep it (one per id, unless not to `keep`)."""
        tools = tuple(opts.tools or ())
        mcp_tools = self._mcp_tools(opts.mcp_servers, frozenset(t.name for t in tools))
        log = SessionLog(session_id, store, lease, state)
        session = Session(
            log,
            provider=provider,
            toolbox=Toolbox(self._tool_table(tools), mcp_tools),
            permission_handler=opts.on_permission_request,
            hooks=hooks,
            owner=self._owner_of_sessions,
            engine=self._engine if lease is None else None,
        )
        if keep:
            self._sessions[session_id] = session
        return session

    def _tool_table(self, tools: tuple[Tool, ...]) -> dict[str, Tool]:
        """The tools by name for a new session: one dict for every open session given the
        same tools, as an app's sessions usually are (nothing changes it), kept while one of
        them is open (`_forget`)."""
        key = tuple(map(id, tools))
        shared = self._tool_tables.get(key)
        if shared is None:
            table = {tool.name: tool for tool in tools}  # names are unique (`SessionOptions`)
            # It holds the tools, so that their ids are not reused while it is kept.
            shared = self._tool_tables[key] = _ToolTable(tools, table)
        shared.sessions += 1
        return shared.table

    def _mcp_tools(self, servers: Mapping[str, Any] | None, reserved: frozenset[str]) -> Any:
        """The session's MCP toolset (`trimtab.mcp`, imported only when servers are named)."""
        if not servers:
            return None
        from trimtab import mcp

        self._mcp = self._mcp or mcp.ServerPool()
        return mcp.toolset(servers, self._mcp, reserved)

    async def _fork(self, source: Session, events: list[Event]) -> Session:
        """A new session holding a copy of `events` (the source's log after its start event),
        with the source's configuration, provider, tools, handlers and MCP servers.

        Inert: the copy gets events of its own (new ids) and is brought to rest in the same
        transaction, so that it never runs a tool or calls the model by itself (spec §6)."""
        session_id = new_id()
        opts = source.options()
        # The fork belongs to whom its source does (spec S16).
        owner = (await (await self._open_store()).get(source.session_id)).owner
        hooks = Hooks(session_id, opts.hooks)
        config = _started(source.config, await hooks.session_start("new"))
        start = SessionStartEvent(
            data=SessionStartData(
                session_id=session_id,
                selected_model=config.model,
                reasoning_effort=config.reasoning_effort,
                config=config,
                forked_from=source.session_id,
                owner=owner,
            )
        )
        copies: list[Event] = [start]
        copies += (  # (a marker of a pruned log stands where its copy stands, X8)
            relocated(event.model_copy(update={"id": new_id()}), position)
            for position, event in enumerate(events, 2)
        )
        copies += _loop.at_rest(state_of(copies))
        provider = cast("Provider", opts.provider)  # the source's own (`Session.options`)
        return await self._created(session_id, copies, provider, opts, hooks)

    def _forget(self, session: Session) -> None:
        if self._sessions.get(session.session_id) is session:
            del self._sessions[session.session_id]
        table = session.options().tools or []
        key = tuple(map(id, table))
        shared = self._tool_tables.get(key)
        if shared is not None and shared.tools == tuple(table):
            shared.sessions -= 1
            if not shared.sessions:
                del self._tool_tables[key]

    async def _provider_spec(
        self, given: dict[str, Any] | Provider | None, persisted: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any] | Provider, bool, str | None]:
        """The provider of a session, whether it is this client's own (the operator's, which
        gets the environment's credentials, spec S1), and the model an automatic choice asks
        for when the session names none.

        In order: the session's own; this client's default config or `Provider`; the one the
        session's log names (on resume); the environment's choice, if the default is "auto"
        (spec S6).
        """
        default = self._default_provider
        if given is not None:
            return given, False, None
        if default is not None and default != "auto":
            return default, True, None
        if persisted is not None and "type" in persisted:
            return dict(persisted), False, None
        if default is None:
            raise ValueError("no provider: pass provider={...} to create_session or to Client()")
        chosen = await self._automatic_choice()
        return chosen.config(), True, chosen.model

    async def _automatic_choice(self) -> AutomaticChoice:
        """The environment's provider (spec S6): chosen once per client, and announced."""
        async with self._choosing:
            if self._automatic is None:
                url = ollama_url(os.environ)
                # The Ollama probe blocks (up to its timeout): not on the event loop.
                chosen = await asyncio.to_thread(choose_automatically, os.environ, ollama_url=url)
                log.warning("%s", chosen.notice("pass provider= to choose another"))
                self._automatic = chosen
            return self._automatic

    def _provider(
        self, spec: dict[str, Any] | Provider, operators: bool
    ) -> tuple[Provider, dict[str, Any]]:
        """The provider `spec` describes, and its config as it may be logged (no secrets).

        Only the operator's provider (`operators`: this client's own) gets credentials from
        the environment for a `base_url` it names; a session's own config, or one rebuilt
        from its log, does not (spec S1). A `Provider` object carries whatever credentials
        its builder gave it.
        """
        if isinstance(spec, Provider):
            self._providers.setdefault(f"instance:{id(spec)}", spec)
            built = getattr(spec, "config", None)
            public = (
                built.public_dict() if isinstance(built, ProviderConfig) else {"type": spec.name}
            )
            return spec, public
        config = ProviderConfig.model_validate(spec)
        # Sessions with the same provider config share one client and its connection pool.
        key = f"{operators}:{config.model_dump_json()}"
        if key not in self._providers:
            self._providers[key] = make_provider(config, env_credentials=operators)
        return self._providers[key], config.public_dict()

    # --- leases --------------------------------------------------------------------------

    async def _maintain(self) -> None:
        """Renew our leases, deliver input queued by other runtimes, take over expired ones."""
        renew_every = self._lease_ttl / 3
        loop = asyncio.get_running_loop()
        last_renewal = loop.time()
        while True:
            await asyncio.sleep(self._poll_interval)
            store = self._store
            if store is None:
                return
            if not self._sessions:
                continue  # nothing to renew, follow or take over (an engine's worker)
            renew = loop.time() - last_renewal >= renew_every
            if renew:
                last_renewal = loop.time()
            try:
                await self._upkeep(store, renew=renew)
            except Exception:
                # Upkeep must survive a transient store error; the next tick retries.
                log.exception("lease upkeep failed")

    async def _upkeep(self, store: Store, *, renew: bool) -> None:
        """One tick of `_maintain` (its own frame: a session it went through is not held
        until the next tick, after the session closed)."""
        if renew:
            kept = set(await store.renew_leases(self._owner, self._lease_ttl))
            for session in list(self._sessions.values()):
                if not session.closed and not session.is_remote and session.session_id not in kept:
                    await ownership_of(session).lost()
        # One read for all: a read per session would cost every idle one each tick.
        waiting = await store.sessions_with_inputs()
        for session in list(self._sessions.values()):
            if session.closed:
                # Closing: its lease is let go of (and not owned meanwhile), never taken again.
                continue
            ownership = ownership_of(session)
            if not ownership.owned:
                lease = await store.acquire_lease(session.session_id, self._owner, self._lease_ttl)
                if lease is not None:
                    await ownership.adopt(lease)
            elif session.session_id in waiting:
                await ownership.take_inputs()


async def _undo_create(store: Store, session_id: str) -> None:
    """Remove a session whose creation failed halfway (best effort: the store may be what
    failed; a log without its `session.start` is never opened, see `_open_state`)."""
    try:
        await store.delete(session_id)
    except Exception:
        log.warning("could not remove the half-created session %s", session_id, exc_info=True)


@dataclass(slots=True, eq=False)
class _ToolTable:
    """A table of tools that open sessions share, and how many of them do."""

    tools: tuple[Tool, ...]
    table: dict[str, Tool]
    sessions: int = 0


_MAX_ID_LENGTH = 200
"""The longest session id: it is a key of every store (PostgreSQL indexes keys up to ~2.7 KB)."""


def _checked_id(session_id: str, what: str = "session_id") -> str:
    """`session_id` if it can name a session in any store, else `ValueError`."""
    if not isinstance(session_id, str) or not session_id.strip():
        raise ValueError(f"{what} must be a non-empty string")
    if len(session_id) > _MAX_ID_LENGTH:
        raise ValueError(f"{what} is longer than {_MAX_ID_LENGTH} characters")
    if valid_text(session_id) != session_id or not session_id.isprintable():
        raise ValueError(f"{what} holds a control character or a lone surrogate")
    return session_id


async def _open_state(store: Store, session_id: str) -> SessionState:
    """The session's state: from its snapshot and the events after it when the snapshot fits
    the log, else by replaying the whole log (spec P1)."""
    saved = await store.load_snapshot(session_id)
    if saved is not None:
        count, data = saved
        try:
            snapshot = StateSnapshot.model_validate_json(data)
        except ValidationError:
            snapshot = None  # written by another version: the log is the truth
        if snapshot is not None and snapshot.event_count == count > 0:
            # The snapshot's last event must be the log's event at that position.
            tail = await store.read(session_id, after=count - 1)
            if tail and tail[0].id == snapshot.last_id:
                replayed = SessionState.restore(snapshot)
                for event in tail[1:]:
                    replayed.apply(event)
                return replayed
    events = await store.read(session_id)
    if not events or not isinstance(events[0], SessionStartEvent):
        # A create that died before storing its start: nothing was ever acknowledged.
        raise SessionNotFoundError(session_id)
    return state_of(events)


def _checked(options: SessionOptions | None, keywords: Mapping[str, Any]) -> SessionOptions:
    """The options of a create or resume, and the `mcp` package when they name MCP servers:
    checked before anything is stored or leased."""
    checked = options_of(options, keywords)
    if checked.mcp_servers:
        from trimtab import mcp

        mcp.check(checked.mcp_servers)
    return checked


def _started(config: SessionConfigData, context: str | None) -> SessionConfigData:
    """`config` with the `sessionStart` hook's context (spec D13): a session opened again
    keeps its own unless the hook answers another (a blank one removes it)."""
    if context is None or context == config.start_context:
        return config
    return storable(config.model_copy(update={"start_context": context or None}))


class _SessionOwner:
    """The `Client` as its sessions see it (`SessionOwner`): one per client."""

    __slots__ = ("_client",)

    def __init__(self, client: Client) -> None:
        self._client = client

    async def fork_session(self, source: Session, events: list[Event]) -> Session:
        return await self._client._fork(source, events)

    def forget_session(self, session: Session) -> None:
        self._client._forget(session)

    @property
    def tracing(self) -> Tracing:
        return self._client._tracing
