"""`--tools builtin` (spec B10): the agent's own tools in the current directory, each call
asked about with what it would do."""

from __future__ import annotations

import pexpect  # type: ignore[import-untyped]

from tests.cli.conftest import Cli, tool_call

ASK = r"\[y\]es once / \[a\]lways this session / \[n\]o: "


def test_b10_run_asks_before_each_builtin_call_showing_the_command(cli: Cli) -> None:
    (cli.cwd / "notes.txt").write_text("draft\n")
    steps = cli.scripted(
        tool_call("edit", path="notes.txt", old_str="draft", new_str="final"),
        tool_call("bash", command="cat notes.txt > copy.txt", description="Copy the notes"),
        "Done.",
    )
    child = cli.spawn("run", "--tools", "builtin", *steps, "Finish the notes")
    child.expect(rf"allow .*edit {cli.cwd}/notes\.txt.*\? {ASK}")
    child.sendline("y")
    child.expect(rf"allow .*bash `cat notes\.txt > copy\.txt`.*\? {ASK}")
    child.sendline("y")
    child.expect_exact("Done.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (cli.cwd / "copy.txt").read_text() == "final\n"


def test_b10_without_a_terminal_or_yes_builtin_calls_are_denied(cli: Cli) -> None:
    steps = cli.scripted(tool_call("bash", command="touch made.txt"), "Could not.")
    result = cli("run", "--tools", "builtin", *steps, "Make it")
    assert result.returncode == 0, result.stderr
    assert "bash `touch made.txt` denied" in result.stderr
    assert not (cli.cwd / "made.txt").exists()
    again = cli.scripted(tool_call("bash", command="touch made.txt"), "Made.")
    yes = cli("run", "--tools", "builtin", "--yes", *again, "Make it")
    assert yes.returncode == 0, yes.stderr
    assert (cli.cwd / "made.txt").exists()
