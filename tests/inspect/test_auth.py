"""Every request to `trimtab inspect` carries a token, on loopback too (spec L9), driven as
an attacker would: another account of the machine, a request without the token or with a
wrong one, the cookie another inspector set. A loopback port is reached by every account of
the machine, and the pages show every session's conversation."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx2 as httpx
import pytest

from tests.inspect.conftest import require_extra
from tests.inspect.test_command import (
    admitted,
    base_of,
    environment,
    inspector_process,
    run,
    seeded_store,
    session_url,
)
from tests.server.accounts import Account

require_extra()

REFUSED = "missing or wrong token: open the URL that 'trimtab inspect' printed"

HTTP_GET = r"""
import http.client, json, sys
from urllib.parse import urlsplit

url, headers = sys.argv[1], json.loads(sys.argv[2])
parts = urlsplit(url)
connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
connection.request("GET", parts.path + ("?" + parts.query if parts.query else ""), headers=headers)
response = connection.getresponse()
print(json.dumps([response.status, response.read().decode("utf-8", "replace")]))
"""
"""A GET in the standard library, redirects not followed: prints `[status, body]`."""


def token_of(url: str) -> str:
    [token] = parse_qs(urlsplit(url).query)["token"]
    return token


def get_as(account: Account, url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """`url` requested by `account`, with `headers`: the status and the body."""
    done = account.run(account.python, "-I", "-c", HTTP_GET, url, json.dumps(headers or {}))
    assert done.returncode == 0, done.stderr
    status, body = json.loads(done.stdout)
    return status, body


def arguments(pid: int) -> str:
    """The command line of process `pid`, which every account of the machine may read."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode()


def pages(base: str, session_id: str) -> list[str]:
    """A URL of every kind of page the inspector serves."""
    return [
        base,
        session_url(base, session_id),
        session_url(base, session_id, "/calls/1"),
        session_url(base, session_id, "/events/1"),
        session_url(base, session_id, "/live"),
    ]


async def test_l9_an_inspector_given_no_token_makes_one_only_its_user_can_read(
    tmp_path: Path, other_account: Account, shared_directory: Path
) -> None:
    home = shared_directory / "home"
    home.mkdir(mode=0o755)  # the token's own directory and file are what keep it private
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store, home=home) as (url, process):
        token = token_of(url)
        token_file = home / "inspect" / f"{urlsplit(url).port}.token"
        assert token_file.read_text() == token  # the token alone, no newline
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        assert len(token) >= 43  # secrets.token_urlsafe(32)
        assert token not in arguments(process.pid)

        # Another account reads neither the file nor its directory, and gets no page without
        # the token, whatever it sends instead.
        assert other_account.run("cat", str(token_file)).returncode != 0
        assert other_account.run("ls", str(token_file.parent)).returncode != 0
        base = base_of(url)
        guesses: list[tuple[str, dict[str, str]]] = [("", {})]
        for guess in ("", "x" * 43, token[:-1], token.upper()):
            guesses += [
                (f"?token={guess}", {}),
                ("", {"authorization": f"Bearer {guess}"}),
                ("", {"cookie": f"trimtab_inspect_0={guess}"}),
            ]
        for page in pages(base, session_id):
            for query, headers in guesses:
                status, body = get_as(other_account, page + query, headers)
                assert (status, body) == (401, REFUSED), (page, query, headers)

        # With the printed URL, the token is traded for a cookie, which opens the pages.
        status, _ = get_as(other_account, url)
        assert status == 303
        async with admitted(url) as (http, _):
            for page in pages(base, session_id)[:-1]:
                assert (await http.get(page)).status_code == 200, page
    assert process.returncode == 0  # stopped as asked (Ctrl-C), as `trimtab serve`
    assert not token_file.exists()  # removed on a clean stop


async def test_l9_requests_without_the_token_are_refused_on_loopback(tmp_path: Path) -> None:
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store) as (url, _):
        token, base = token_of(url), base_of(url)
        async with httpx.AsyncClient(timeout=30) as http:
            for page in pages(base, session_id):
                for query, headers in [
                    ("", {}),
                    ("?token=", {}),
                    (f"?token={token[:-1]}", {}),
                    (f"?token={token}x", {}),
                    ("", {"authorization": f"Bearer {token[1:]}"}),
                    ("", {"authorization": f"Basic {token}"}),
                ]:
                    refused = await http.get(page + query, headers=headers)
                    assert refused.status_code == 401, (page, query, headers)
                    assert refused.text == REFUSED
                    assert session_id not in refused.text
                    assert "set-cookie" not in refused.headers

            # The printed URL: a cookie, HttpOnly and for this site only, and a redirect to
            # the same page without the token.
            opened = await http.get(session_url(base, session_id, f"?page=1&token={token}"))
            cookie = opened.headers["set-cookie"]
            bearer = await http.get(base, headers={"authorization": f"Bearer {token}"})
        async with admitted(url) as (browser, _):
            shown = await browser.get(session_url(base, session_id))

    assert opened.status_code == 303
    assert opened.headers["location"] == f"/sessions/{session_id}?page=1"
    assert token not in opened.headers["location"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert shown.status_code == 200 and "context cleared: 2 messages" in shown.text
    assert bearer.status_code == 200


async def test_l9_the_cookie_of_another_inspector_opens_nothing(tmp_path: Path) -> None:
    store, session_id = await seeded_store(tmp_path)
    with (
        inspector_process(tmp_path, "--store", store) as (first, _),
        inspector_process(tmp_path, "--store", store) as (second, _),
    ):
        assert token_of(first) != token_of(second)
        # A browser sends the cookies of 127.0.0.1 to every port of it: the second
        # inspector gets the first one's cookie, and must not take it for its own.
        async with admitted(first) as (http, _):
            [(name, value)] = http.cookies.items()
            to_second = await http.get(base_of(second))
            to_first = await http.get(base_of(first))
        async with admitted(second) as (own, _):
            [(second_name, second_value)] = own.cookies.items()
        async with httpx.AsyncClient(timeout=30) as http:
            renamed = await http.get(
                session_url(base_of(second), session_id),
                headers={"cookie": f"{second_name}={value}"},
            )

    assert to_first.status_code == 200
    assert to_second.status_code == 401 and to_second.text == REFUSED
    assert name != second_name and value != second_value
    assert renamed.status_code == 401 and renamed.text == REFUSED


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_l9_the_token_file_goes_when_the_inspector_stops(
    tmp_path: Path, stop: signal.Signals
) -> None:
    store = tmp_path / "empty.db"
    store.touch()
    home = tmp_path / "home"
    with inspector_process(tmp_path, "--store", str(store)) as (url, process):
        token_file = home / "inspect" / f"{urlsplit(url).port}.token"
        assert token_file.read_text() == token_of(url)
        process.send_signal(stop)
        process.wait(timeout=30)
        assert process.returncode == 0
        assert process.stderr is not None
        assert process.stderr.read() == f"trimtab: the inspector's token is also in {token_file}\n"
    assert not token_file.exists()
    assert list(token_file.parent.iterdir()) == []


def test_l9_the_token_is_not_written_where_others_may_enter(tmp_path: Path) -> None:
    store = tmp_path / "empty.db"
    store.touch()
    (tmp_path / "home" / "inspect").mkdir(parents=True)
    (tmp_path / "home" / "inspect").chmod(0o777)

    result = run(tmp_path, "inspect", "--store", str(store), "--port", "0")

    assert result.returncode == 1 and result.stdout == ""
    [error, hint] = result.stderr.splitlines()
    assert error.startswith("error: cannot write the inspector's token: "), error
    assert "mode 777" in error
    assert hint == "hint: set TRIMTAB_HOME to a directory of yours, or pass --token"
    assert list((tmp_path / "home" / "inspect").iterdir()) == []


@pytest.mark.parametrize(
    ("args", "token_variable"),
    [
        (["--no-auth", "--host", "0.0.0.0"], None),
        (["--no-auth", "--host", "::"], None),
        (["--no-auth", "--host", "my-laptop.example"], None),
        (["--no-auth", "--token", "t"], None),
        (["--no-auth"], "t"),
    ],
)
def test_l9_no_auth_is_for_loopback_without_a_token(
    tmp_path: Path, args: list[str], token_variable: str | None
) -> None:
    env = environment(tmp_path)
    if token_variable is not None:
        env["TRIMTAB_INSPECT_TOKEN"] = token_variable
    result = subprocess.run(
        [sys.executable, "-m", "trimtab", "inspect", "--store", str(tmp_path / "none.db"), *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )

    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: --no-auth is for an inspector on a loopback address, without a token (--token,"
        " TRIMTAB_INSPECT_TOKEN): every account of this machine could read your sessions",
        "hint: see 'trimtab inspect --help'",
    ]
    assert not (tmp_path / "home").exists()


async def test_l9_no_auth_on_loopback_serves_without_a_token_and_says_what_it_allows(
    tmp_path: Path,
) -> None:
    store, session_id = await seeded_store(tmp_path)
    with inspector_process(tmp_path, "--store", store, "--no-auth") as (url, _):
        async with httpx.AsyncClient(timeout=30) as http:
            page = await http.get(session_url(url, session_id))
            rebinding = await http.get(url, headers={"host": "attacker.example"})
    help_text = run(tmp_path, "inspect", "--help")

    assert "?" not in url
    assert page.status_code == 200 and "context cleared: 2 messages" in page.text
    assert rebinding.status_code == 421  # a page elsewhere still gets nothing (DNS rebinding)
    assert not (tmp_path / "home" / "inspect").exists()
    assert "every account of this machine can then read every session" in " ".join(
        help_text.stdout.split()
    )
