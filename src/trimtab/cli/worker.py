"""`trimtab worker`: run sessions' runs for a durable execution engine (spec EN2).

It serves the engine's task queue until stopped (Ctrl-C or SIGTERM, which let the runs in
progress go on for a while, then hand them over). Tools come as `module:attribute`: a `Tool`
or a list of them, importable here.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from trimtab import Tool
from trimtab.cli.errors import EXIT_USAGE, CliError

__all__ = ["load_tools", "run_worker"]

log = logging.getLogger("trimtab")


def load_tools(specs: Sequence[str]) -> list[Tool]:
    """The tools named by `module:attribute` specs, in order; `CliError` for one that does
    not import or is not a `Tool` or a list of them."""
    tools: list[Tool] = []
    for spec in specs:
        module_name, colon, attribute = spec.partition(":")
        if not colon or not module_name or not attribute:
            raise CliError(f"--tools {spec!r}: expected module:attribute", exit_code=EXIT_USAGE)
        try:
            value: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                value = getattr(value, part)
        except (ImportError, AttributeError) as exc:
            raise CliError(f"--tools {spec!r}: {exc}", exit_code=EXIT_USAGE) from None
        found = [value] if isinstance(value, Tool) else _tools_in(value)
        if found is None:
            raise CliError(
                f"--tools {spec!r} is a {type(value).__name__}, not a Tool or a list of them",
                exit_code=EXIT_USAGE,
            )
        tools += found
    names = [tool.name for tool in tools]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise CliError(f"--tools name {', '.join(twice)} more than once", exit_code=EXIT_USAGE)
    return tools


def _tools_in(value: object) -> list[Tool] | None:
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | dict):
        items = list(value)
        if all(isinstance(item, Tool) for item in items):
            return items
    return None


def run_worker(
    *,
    engine: str,
    store: str | None,
    tools: Sequence[str],
    provider: dict[str, Any] | None,
    task_queue: str,
    lease_ttl: float,
    max_runs: int,
) -> NoReturn:
    """Serve until stopped, then exit."""
    from trimtab.temporal import TemporalEngine, Worker

    try:
        temporal = TemporalEngine(engine, task_queue=task_queue)
    except ValueError as exc:
        raise CliError(f"--engine: {exc}", exit_code=EXIT_USAGE) from None
    worker = Worker(
        temporal,
        store=store,
        tools=load_tools(tools),
        provider=provider or "auto",
        lease_ttl=lease_ttl,
        max_runs=max_runs,
    )
    status = 0
    try:
        asyncio.run(_serve(worker))
    except KeyboardInterrupt:
        pass
    except CliError as exc:
        from trimtab.cli.render import Terminal

        Terminal.detect().error(exc.message, exc.hint)
        status = exc.exit_code
    # Stopped: the process ends here, skipping the interpreter's teardown, during which the
    # Temporal SDK's own threads may still call into Python and abort it
    # (temporalio/sdk-python#300).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


async def _serve(worker: Any) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await worker.start()
    except Exception as exc:
        await worker.stop()
        raise CliError(
            f"cannot start the worker: {exc}",
            hint="check --engine (is the Temporal server up?) and --store",
        ) from None
    print(f"worker ready on {worker.engine.name} queue {worker.engine.task_queue}", flush=True)
    try:
        await worker.wait()
    except asyncio.CancelledError:
        pass
    finally:
        await worker.stop()
