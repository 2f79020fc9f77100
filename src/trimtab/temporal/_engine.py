"""`TemporalEngine`: a `Client`'s sessions run by Temporal (spec EN1).

The client side of the engine: it starts each session's workflow, submits inputs (stored in
the session's inbox first), asks for aborts and sends answers, each as a workflow update
whose id makes a repeated one harmless. Its workers (`Worker`) run the sessions.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from trimtab._durations import check_seconds
from trimtab._engine import Answer
from trimtab.temporal._workflow import WORKFLOW, SessionParams, workflow_id

__all__ = ["DEFAULT_TASK_QUEUE", "TemporalEngine", "parse_engine_url"]

log = logging.getLogger("trimtab.temporal")

DEFAULT_TASK_QUEUE = "trimtab"
"""The task queue sessions' runs go to, which `trimtab worker` serves."""


def parse_engine_url(url: str) -> tuple[str, str, str | None]:
    """`(address, namespace, task queue)` of
    `temporal://HOST:PORT[/NAMESPACE][?task_queue=NAME]`; `ValueError` for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "temporal" or not parts.netloc or parts.fragment:
        raise ValueError(f"an engine is temporal://HOST:PORT[/NAMESPACE], not {url!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or port == 0:
        raise ValueError(f"an engine address is HOST:PORT, not {parts.netloc!r}")
    query = parse_qs(parts.query, strict_parsing=bool(parts.query))
    unknown = set(query) - {"task_queue"}
    if unknown or any(len(values) != 1 for values in query.values()):
        raise ValueError(f"an engine URL takes one task_queue=NAME, not {parts.query!r}")
    namespace = parts.path.strip("/") or "default"
    return parts.netloc, namespace, query.get("task_queue", [None])[0]


class TemporalEngine:
    """Temporal runs the sessions of the `Client` given this engine.

    ```python
    engine = TemporalEngine("temporal-host:7233")
    async with Client(store="postgresql://...", engine=engine) as client:
        session = await client.create_session(...)
    ```

    Args:
        address: The Temporal frontend, `HOST:PORT`, or a URL
            `temporal://HOST:PORT[/NAMESPACE][?task_queue=NAME]`.
        namespace: The Temporal namespace of the sessions' workflows.
        task_queue: Where their runs go: the queue the workers serve.
        heartbeat_timeout: Seconds after which an attempt that stopped heartbeating (its
            worker died or stalled) is taken over by another worker (spec EN3).
        park_after: Seconds a run waits for an answer (a permission, a client's tool)
            before it parks, holding no worker (EN5).
        pending_timeout: Seconds a parked run's question waits for an answer before it is
            given up: a permission is `user-not-available`, a client's call fails (D6).
        client: A connected Temporal client to use instead of connecting to `address`.

    The timings are those of the sessions whose workflows this engine starts; a session's
    workflow keeps the ones it started with.
    """

    def __init__(
        self,
        address: str = "127.0.0.1:7233",
        *,
        namespace: str | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        heartbeat_timeout: float = 10.0,
        park_after: float = 2.0,
        pending_timeout: float = 120.0,
        client: TemporalClient | None = None,
    ) -> None:
        check_seconds("heartbeat_timeout", heartbeat_timeout)
        check_seconds("park_after", park_after)
        check_seconds("pending_timeout", pending_timeout)
        if address.startswith("temporal://"):
            address, parsed, queue = parse_engine_url(address)
            namespace = namespace or parsed
            task_queue = queue or task_queue
        self.address = address
        self.namespace = namespace or "default"
        self.task_queue = task_queue
        self.heartbeat_timeout = heartbeat_timeout
        self.park_after = park_after
        self.pending_timeout = pending_timeout
        self._client = client

    @property
    def name(self) -> str:
        return f"temporal://{self.address}/{self.namespace}"

    @property
    def client(self) -> TemporalClient:
        """The Temporal client, once started."""
        if self._client is None:
            raise RuntimeError(f"the engine {self.name} is not started")
        return self._client

    async def start(self) -> None:
        if self._client is None:
            self._client = await self.connect()

    async def connect(self) -> TemporalClient:
        """A connection of its own to the engine's namespace (each worker has one: Temporal
        registers one worker per connection and task queue)."""
        return await TemporalClient.connect(self.address, namespace=self.namespace)

    async def stop(self) -> None:
        return None  # the client's connection closes with it

    async def open_session(self, session_id: str) -> None:
        params = SessionParams(
            session_id=session_id,
            task_queue=self.task_queue,
            heartbeat_timeout=self.heartbeat_timeout,
            park_after=self.park_after,
            pending_timeout=self.pending_timeout,
        )
        await self.client.start_workflow(
            WORKFLOW,
            params,
            id=workflow_id(session_id),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            # A worker that stalls or is paused may have taken the workflow's task already:
            # it is handed to another after this, not Temporal's default 10 s.
            task_timeout=timedelta(seconds=min(self.heartbeat_timeout, 60.0)),
        )

    async def submit(self, session_id: str, message_id: str) -> None:
        await self._update(session_id, "submit", [message_id], f"submit:{message_id}")

    async def abort(self, session_id: str) -> None:
        await self._update(session_id, "abort", [], f"abort:{uuid.uuid4().hex}")

    async def answer(self, session_id: str, request_id: str, answer: Answer) -> bool:
        payload = answer.model_dump(mode="json")
        accepted = await self._update(
            session_id, "answer", [request_id, payload], f"answer:{request_id}"
        )
        return accepted is True

    async def delete_session(self, session_id: str) -> None:
        try:
            await self._handle(session_id).terminate(reason="the session was deleted")
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise

    def _handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(workflow_id(session_id))

    async def _update(self, session_id: str, name: str, args: list[Any], update_id: str) -> Any:
        """Run an update of the session's workflow; a workflow that is gone (terminated,
        or a session created before the engine ran it) is started again first."""
        for attempt in range(2):
            try:
                return await self._handle(session_id).execute_update(name, args=args, id=update_id)
            except WorkflowUpdateFailedError as exc:
                raise ValueError(f"the engine refused {name}: {exc.cause}") from None
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND or attempt:
                    raise
                log.info("starting the workflow of session %s again", session_id)
                await self.open_session(session_id)
        raise AssertionError("unreachable")
