"""Issue 18: `trimtab run/chat --mcp NAME=COMMAND` and the `[mcp_servers]` table of
trimtab.toml give sessions the tools of MCP servers (spec MCP10)."""

from __future__ import annotations

import json
import sys

from tests.cli.conftest import SRC, Cli, json_lines, no_traceback, tool_call
from tests.cli.test_first_hour import _main_without
from tests.mcp.conftest import DEMO


def completions(stdout: str) -> list[dict[str, object]]:
    return [e["data"] for e in json_lines(stdout) if e["type"] == "tool.execution_complete"]


def test_mcp10_run_with_an_mcp_flag_calls_the_servers_tool(cli: Cli) -> None:
    steps = cli.scripted(tool_call("demo__add", a=20, b=22), "It is 42.")
    flag = f"demo={sys.executable} {DEMO} stdio"
    result = cli("run", "--json", "--yes", "--mcp", flag, *steps, "Add 20 and 22")
    assert result.returncode == 0, result.stderr
    (done,) = completions(result.stdout)
    assert done["toolName"] == "demo__add" and done["result"] == {"content": "42"}


def test_mcp10_the_config_files_mcp_servers_table(cli: Cli) -> None:
    (cli.cwd / "trimtab.toml").write_text(
        f"[mcp_servers.demo]\ncommand = {json.dumps(sys.executable)}\n"
        f'args = [{json.dumps(str(DEMO))}]\ntools = ["echo"]\n'
    )
    steps = cli.scripted(tool_call("demo__echo", text="from the file"), "done")
    result = cli("run", "--json", "--yes", *steps, "Echo")
    assert result.returncode == 0, result.stderr
    assert completions(result.stdout)[0]["result"] == {"content": "from the file"}
    shown = cli("config", "--json")
    setting = json.loads(shown.stdout)["settings"]["mcp_servers"]
    assert setting["value"]["demo"]["tools"] == ["echo"]
    assert setting["source"].endswith("trimtab.toml")


def test_mcp10_bad_mcp_settings_are_usage_errors(cli: Cli) -> None:
    result = cli("run", "--mcp", "no-command", "Hi")
    assert result.returncode == 2 and "invalid value 'no-command' for --mcp" in result.stderr
    (cli.cwd / "trimtab.toml").write_text('[mcp_servers.x]\ntype = "http"\nurl = "ftp://h"\n')
    result = cli("run", "Hi")
    assert result.returncode == 2 and "MCP server 'x': url" in result.stderr


def test_issue33_without_the_mcp_package_the_hint_names_the_mcp_extra(cli: Cli) -> None:
    checkout = SRC.parent
    no_mcp = "sys.modules['mcp'] = None  # as if the mcp package were not installed"
    flagged = _main_without(no_mcp, cli, "run", "--mcp", "x=echo hi", *cli.scripted(), "Hi")
    (cli.cwd / "trimtab.toml").write_text('[mcp_servers.x]\ncommand = "echo"\n')
    filed = _main_without(no_mcp, cli, "run", *cli.scripted(), "Hi")

    assert flagged.returncode == 1 and no_traceback(flagged)
    assert flagged.stderr.splitlines() == [
        "error: MCP servers (--mcp) need the mcp package",
        f"hint: install it with pip install -e '{checkout}[mcp]', or run without --mcp",
    ]
    assert filed.returncode == 1 and no_traceback(filed)
    toml = cli.cwd / "trimtab.toml"
    assert filed.stderr.splitlines() == [
        f"error: MCP servers ({toml}) need the mcp package",
        f"hint: install it with pip install -e '{checkout}[mcp]', or remove [mcp_servers]"
        f" from {toml}",
    ]
