"""The `trimtab` command line (also `python -m trimtab`).

An adapter over the public API: it resolves settings, opens sessions with `trimtab.Client`
and renders their events. `main` turns every failure into one line plus a hint and an exit
code (0 ok, 1 failed, 2 bad usage, 130 interrupted); `--debug` shows tracebacks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: the process's arguments); return the exit code."""
    import click

    from trimtab.cli.app import cli
    from trimtab.cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError
    from trimtab.cli.render import Terminal

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args=args, prog_name="trimtab", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.format_message())
        return EXIT_USAGE
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "trimtab"
        Terminal.detect().error(_first_line(exc.format_message()), f"see '{command} --help'")
        return EXIT_USAGE
    except click.ClickException as exc:  # a command's own failure: `serve`'s port in use
        Terminal.detect().error(_first_line(exc.format_message()), getattr(exc, "hint", None))
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    except CliError as exc:
        Terminal.detect().error(exc.message, exc.hint)
        return exc.exit_code
    except BrokenPipeError:
        # The reader went away (`trimtab sessions list | head -1`): not an error to report.
        _silence_stdout()
        return EXIT_ERROR
    except Exception as exc:
        if "--debug" in args or _env_flag("TRIMTAB_DEBUG"):
            raise
        Terminal.detect().error(
            f"unexpected {type(exc).__name__}: {_first_line(str(exc))}",
            "run again with --debug to see the traceback",
        )
        return EXIT_ERROR
    return result if isinstance(result, int) else 0


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _silence_stdout() -> None:
    # Python flushes stdout at exit and would report the broken pipe a second time.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
