"""Replay the built-in tool calls of the Copilot SDK's recorded conversations against
trimtab's built-in tools, and check that each result is byte-equal to the recorded one.

Local only (not run in CI: it needs a clone of github/copilot-sdk). Each recorded
conversation is replayed in a fresh directory holding the files its end-to-end test writes
before the prompt (`SETUP`, taken from the SDK's `python/e2e` tests); the calls of the
built-in tools run in order, paths under `${workdir}` pointing into that directory, and
each result is compared with the recording, the directory written back as `${workdir}`.

    python scripts/replay_builtin_snapshots.py PATH/TO/copilot-sdk [--verbose]

PATH may be a work tree or a bare repository (its HEAD is read with git).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, cast

import yaml

from trimtab import builtin_tools
from trimtab._tools import CallOutcome, Tool, ToolInvocation
from trimtab.builtin import BUILTIN_TOOLS

SHELL = "${shell}"
"""The harness's name for the platform's shell tool (`bash` here)."""
WORKDIR = "${workdir}"

SETUP: dict[str, dict[str, str]] = {
    "builtin_tools/should_edit_a_file_successfully": {
        "edit_me.txt": "Hello World\nGoodbye World\n"
    },
    "builtin_tools/should_find_files_by_pattern": {
        "src/index.ts": "export const index = 1;",
        "README.md": "# Readme",
    },
    "builtin_tools/should_read_file_with_line_range": {
        "lines.txt": "line1\nline2\nline3\nline4\nline5\n"
    },
    "builtin_tools/should_search_for_patterns_in_files": {
        "data.txt": "apple\nbanana\napricot\ncherry\n"
    },
    "client_options/should_use_client_cwd_for_default_workingdirectory": {
        "client-cwd/marker.txt": "I am in the client cwd"
    },
    "event_fidelity/should_emit_events_in_correct_order_for_tool_using_conversation": {
        "hello.txt": "Hello World"
    },
    "event_fidelity/should_emit_tool_execution_events_with_correct_fields": {
        "data.txt": "test data"
    },
    "event_fidelity/should_preserve_message_order_in_getmessages_after_tool_use": {
        "order.txt": "ORDER_CONTENT_42"
    },
    "hooks/invoke_both_hooks_for_single_tool_call": {"both.txt": "Testing both hooks!"},
    "hooks/invoke_post_tool_use_hook_after_model_runs_a_tool": {
        "world.txt": "World from the test!"
    },
    "hooks/invoke_pre_tool_use_hook_when_model_runs_a_tool": {"hello.txt": "Hello from the test!"},
    "hooks/should_invoke_both_pretooluse_and_posttooluse_hooks_for_a_single_tool_call": {
        "both.txt": "Testing both hooks!"
    },
    "hooks/should_invoke_both_pretooluse_and_posttooluse_hooks_for_single_tool_call": {
        "both.txt": "Testing both hooks!"
    },
    "hooks/should_invoke_posttooluse_hook_after_model_runs_a_tool": {
        "world.txt": "World from the test!"
    },
    "hooks/should_invoke_pretooluse_hook_when_model_runs_a_tool": {
        "hello.txt": "Hello from the test!"
    },
    "multi_turn/should_use_tool_results_from_previous_turns": {
        "secret.txt": "The magic number is 42."
    },
    "permissions/permission_handler_for_write_operations": {"test.txt": "original content"},
    "permissions/should_invoke_permission_handler_for_write_operations": {
        "test.txt": "original content"
    },
    "session/should_send_with_directory_attachment": {
        "attached-directory/readme.txt": "Directory attachment content"
    },
    "session/should_send_with_file_attachment": {"attached-file.txt": "FILE_ATTACHMENT_SENTINEL"},
    "session_config/should_accept_message_attachments": {"attached.txt": "This file is attached"},
    "session_config/should_apply_workingdirectory_on_session_resume": {
        "resume-subproject/resume-marker.txt": "I am in the resume working directory"
    },
    "session_config/should_use_workingdirectory_for_tool_execution": {
        "subproject/marker.txt": "I am in the subdirectory"
    },
    "subagent_hooks/should_invoke_pretooluse_and_posttooluse_hooks_for_sub_agent_tool_calls": {
        "subagent-test.txt": "Hello from subagent test!"
    },
    "system_message_transform/should_apply_transform_modifications_to_section_content": {
        "hello.txt": "Hello!"
    },
    "system_message_transform/should_invoke_transform_callbacks_with_section_content": {
        "test.txt": "Hello transform!"
    },
    "system_message_transform/should_work_with_static_overrides_and_transforms_together": {
        "combo.txt": "Combo test!"
    },
    "tools/invokes_built_in_tools": {"README.md": "# ELIZA, the only chatbot you'll ever need"},
}
"""The files each recorded test writes before its prompt."""

OVERRIDDEN = {"tools/overrides_built_in_tool_with_custom_tool"}
"""Recordings in which the client's own tool of a built-in's name replaced it."""

NOT_THE_TOOLS_OUTPUT = (
    "Denied by preToolUse hook",
    "Permission denied and could not request permission",
    "The execution of this tool, or a previous tool was interrupted.",
    "modified by post hook",
    "Tool 'view' does not exist.",
)
"""Recorded results that a hook, a denial, an abort or `availableTools` made, not the tool."""


def snapshots(source: Path) -> dict[str, Any]:
    """Every recorded conversation file, by its name under test/snapshots (no suffix)."""
    if (source / "test" / "snapshots").is_dir():
        files = sorted((source / "test" / "snapshots").rglob("*.yaml"))
        return {
            str(f.relative_to(source / "test" / "snapshots").with_suffix("")): yaml.safe_load(
                f.read_text(encoding="utf-8")
            )
            for f in files
        }
    git = ["git", "-C", str(source)]
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD", "test/snapshots"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    loaded = {}
    for name in names:
        if name.endswith(".yaml"):
            text = subprocess.run(
                [*git, "show", f"HEAD:{name}"], capture_output=True, text=True, check=True
            ).stdout
            loaded[name.removeprefix("test/snapshots/").removesuffix(".yaml")] = yaml.safe_load(
                text
            )
    return loaded


def recorded_calls(conversation: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(tool, arguments, recorded result) of each built-in call, in order."""
    calls: dict[str, tuple[str, str]] = {}
    found = []
    for message in conversation.get("messages") or []:
        for call in message.get("tool_calls") or []:
            calls[call["id"]] = (call["function"]["name"], call["function"]["arguments"])
        if message.get("role") == "tool" and message["tool_call_id"] in calls:
            name, arguments = calls[message["tool_call_id"]]
            if name == SHELL or name in BUILTIN_TOOLS:
                found.append((name, arguments, message.get("content") or ""))
    return found


async def run(tool: Tool, arguments: Any) -> CallOutcome:
    params = tool.validate(arguments)
    if isinstance(params, CallOutcome):
        return params
    invocation = ToolInvocation("replay", "call", tool.name, arguments, cast(Any, None))
    return await tool.run(params, invocation)


async def replay(name: str, conversation: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(verdict, tool, expected, got) of each built-in call of one conversation."""
    results = []
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for path, text in SETUP.get(name, {}).items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text, encoding="utf-8")
        given = {t.name: t for t in builtin_tools(root, names=BUILTIN_TOOLS)}
        for tool_name, arguments_text, expected in recorded_calls(conversation):
            name_here = "bash" if tool_name == SHELL else tool_name
            # The harness drops the list of tools the CLI appends to this error.
            expected = expected.split(" Available tools that can be called are ")[0]
            if expected.endswith(" does not exist.") is False and expected.startswith(
                NOT_THE_TOOLS_OUTPUT
            ):
                results.append(("skipped", name_here, expected, "(not the tool's output)"))
                continue
            if expected == f"Tool '{name_here}' does not exist.":
                if name_here != "report_intent":
                    results.append(("skipped", name_here, expected, "(availableTools left it out)"))
                    continue
                # The recording's CLI did not have it: neither does a trimtab session that is
                # not given it (report_intent is given only when named, spec B1).
                results.append(("equal", name_here, expected, expected))
                continue
            if name in OVERRIDDEN:
                results.append(("skipped", name_here, expected, "(the client's own tool ran)"))
                continue
            if expected == "Viewed image file successfully.":
                results.append(("left out", name_here, expected, "(images: spec B3)"))
                continue
            arguments = json.loads(arguments_text.replace(WORKDIR, str(root)))
            outcome = await run(given[name_here], arguments)
            got = outcome.text.replace(str(root), WORKDIR)
            results.append(("equal" if got == expected else "differs", name_here, expected, got))
    return results


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a clone of github/copilot-sdk")
    parser.add_argument("--verbose", action="store_true", help="show every call")
    options = parser.parse_args()
    seen: set[tuple[str, str, str]] = set()
    verdicts: Counter[tuple[str, str]] = Counter()
    for name, recording in snapshots(options.source).items():
        for conversation in recording.get("conversations") or []:
            for verdict, tool, expected, got in await replay(name, conversation):
                key = (name, tool, expected)
                if key in seen:
                    continue  # a longer conversation repeats its prefix's calls
                seen.add(key)
                verdicts[(tool, verdict)] += 1
                if verdict == "differs" or options.verbose:
                    print(
                        f"{verdict:8} {name} [{tool}]\n  expected {expected!r}\n  got      {got!r}"
                    )
    print("\nbuilt-in calls of the recordings, by tool:")
    for tool in sorted({t for t, _ in verdicts}):
        row = {v: verdicts[(tool, v)] for v in ("equal", "differs", "skipped", "left out")}
        print(f"  {tool:14}", "  ".join(f"{v} {n:3}" for v, n in row.items()))
    return 1 if any(v == "differs" for _, v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
