"""Who may connect to a server, and whose sessions each client sees (spec S10, S16).

A socket always asks for a token: the one given (`--token`, `COPILOT_CONNECTION_TOKEN`), one
per client (`--tokens-file`), or one the server makes at start and writes where only its
user can read it, as notebook servers do (`TokenFile`, in `trimtab.store._files`). Only
`--no-auth` (loopback alone) and stdio, whose client is the user who started the server, take none.
"""

from __future__ import annotations

import hmac
import os
import stat
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ANYONE", "Credentials", "Identity"]

MAX_NAME = 200
"""The longest name of a token: it is stored as each of its sessions' owner."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a connection is: the name of the token it presented, if tokens have names."""

    name: str | None = None
    """The token's name in the tokens file, which its sessions record as their owner; None
    on a server with one token or none, whose clients are all the same one."""
    admin: bool = False
    """The token sees every client's sessions (`--admin NAME`)."""

    def sees(self, owner: str | None) -> bool:
        """Whether a session of `owner` exists for this client (spec S16)."""
        return self.name is None or self.admin or owner == self.name


ANYONE = Identity()
"""A client of a server whose clients are one: it sees every session, and owns none."""


class Credentials:
    """The tokens a server accepts, and who each stands for.

    Args:
        tokens: Each token and its identity; None when no token is asked for (stdio, and
            `--no-auth`): every client is `ANYONE` then.

    Raises:
        ValueError: An empty token, which would authenticate nobody.
    """

    def __init__(self, tokens: Mapping[str, Identity] | None = None) -> None:
        if tokens is not None and (not tokens or "" in tokens):
            raise ValueError("an empty connection token authenticates nobody: pass None")
        self._tokens = None if tokens is None else [(_raw(t), i) for t, i in tokens.items()]

    @classmethod
    def single(cls, token: str) -> Credentials:
        """One token, which every client presents."""
        return cls({token: ANYONE})

    @classmethod
    def from_file(cls, path: Path, admins: Sequence[str] = ()) -> Credentials:
        """The tokens of a `--tokens-file`: TOML, `name = "token"` each.

        Raises:
            ValueError: The file cannot be read, other accounts may read it, it is not such
                a table, two names share a token, or an admin names no token.
        """
        tokens = _read_tokens(path)
        if unknown := sorted(set(admins) - set(tokens)):
            raise ValueError(f"--admin {unknown[0]!r} is not a name of {path}")
        return cls({token: Identity(name, name in admins) for name, token in tokens.items()})

    @property
    def required(self) -> bool:
        """Whether a client must present a token before anything else."""
        return self._tokens is not None

    def identify(self, given: str | None) -> Identity | None:
        """Who `given` stands for; None when it is no token of this server."""
        if self._tokens is None:
            return ANYONE
        if given is None:
            return None
        raw = _raw(given)
        found: Identity | None = None
        for token, identity in self._tokens:
            # Every token compared, in constant time: how long a refusal takes tells nothing.
            if hmac.compare_digest(raw, token) and found is None:
                found = identity
        return found


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # any string a JSON client can send


def _read_tokens(path: Path) -> dict[str, str]:
    where = f"--tokens-file {path}"
    try:
        with path.open("rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if sys.platform != "win32" and mode & 0o077:
                raise ValueError(
                    f"{where} may be read by other accounts (mode {stat.S_IMODE(mode):o}):"
                    f" chmod 600 {path}"
                )
            table = tomllib.load(file)
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where} is not TOML: {exc}") from None
    if not table:
        raise ValueError(f'{where} names no token: write name = "token" lines')
    names: dict[str, str] = {}
    for name, token in table.items():
        if not isinstance(token, str) or not token:
            raise ValueError(f'{where}: {name!r} must be a non-empty string: name = "token"')
        if len(name) > MAX_NAME or not name.isprintable() or not name.strip():
            raise ValueError(f"{where}: the name {name!r} is not 1 to {MAX_NAME} printable chars")
        if token in names:
            raise ValueError(f"{where}: {names[token]!r} and {name!r} have the same token")
        names[token] = name
    return {name: token for token, name in names.items()}
