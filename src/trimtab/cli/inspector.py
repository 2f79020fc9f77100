"""`trimtab inspect`: serve the session inspector (`trimtab.inspect`) over the configured store.

Like the `sessions` commands it only reads: a SQLite store that does not exist is reported,
never created.
"""

from __future__ import annotations

import asyncio

from trimtab.cli.config import Resolved
from trimtab.cli.errors import EXIT_USAGE, CliError
from trimtab.cli.host import store_file

__all__ = ["run_inspector"]

_HINT = "see 'trimtab inspect --help'"


def run_inspector(
    resolved: Resolved, *, host: str, port: int, token: str | None, no_auth: bool = False
) -> int:
    """Serve the inspector until Ctrl-C."""
    try:
        from trimtab.inspect.serve import InspectError, check_address, serve
    except ImportError as exc:
        from trimtab.providers._install import install_command

        missing = (exc.name or str(exc)).split(".")[0]
        raise CliError(
            f"the inspector needs the inspect extra ({missing} is missing)",
            hint=f"install it with {install_command('inspect')}",
        ) from None
    try:
        check_address(host, token, no_auth=no_auth)
    except ValueError as exc:
        raise CliError(str(exc), hint=_HINT, exit_code=EXIT_USAGE) from None
    config = resolved.config
    file = store_file(config.store, config.home)
    if file is not None and not file.exists():
        raise CliError(
            f"there is no session store at {file}",
            hint="check --store, TRIMTAB_STORE or TRIMTAB_HOME; inspecting never creates one",
        )
    try:
        asyncio.run(
            serve(
                config.store,
                home=config.home,
                host=host,
                port=port,
                token=token,
                no_auth=no_auth,
            )
        )
    except ValueError as exc:
        raise CliError(
            str(exc), hint="fix --store or TRIMTAB_STORE", exit_code=EXIT_USAGE
        ) from None
    except InspectError as exc:
        raise CliError(str(exc), hint=exc.hint) from None
    return 0
