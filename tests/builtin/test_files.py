"""The built-in file and search tools (spec B1-B4, B7): confinement, result texts, limits,
permission requests and denials, each through a real session."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builtin.conftest import run_calls
from trimtab import Client, PermissionDecision, builtin_tools
from trimtab.builtin import BUILTIN_TOOLS, DEFAULT_BUILTIN_TOOLS

FILE_TOOLS = ["view", "create", "edit", "grep", "glob"]


def arguments(tool: str, path: str) -> dict[str, Any]:
    return {
        "view": {"path": path},
        "create": {"path": path, "file_text": "x"},
        "edit": {"path": path, "old_str": "SECRET", "new_str": "LEAKED"},
        "grep": {"pattern": "SECRET", "path": path, "output_mode": "content"},
        "glob": {"pattern": "*", "path": path},
    }[tool]


def test_b1_the_default_set_and_report_intent_on_request(root: Path) -> None:
    assert [t.name for t in builtin_tools(root)] == list(DEFAULT_BUILTIN_TOOLS)
    assert [t.name for t in builtin_tools(root, names=["report_intent"])] == ["report_intent"]
    assert [t.name for t in builtin_tools(root, names=BUILTIN_TOOLS)] == list(BUILTIN_TOOLS)
    with pytest.raises(ValueError, match="not built-in tools: nope"):
        builtin_tools(root, names=["nope"])
    with pytest.raises(ValueError, match="not a directory"):
        builtin_tools(root / "missing")


async def test_b1_report_intent_asks_nothing(client: Client, root: Path) -> None:
    calls = await run_calls(
        client, builtin_tools(root, names=["report_intent"]), ("report_intent", {"intent": "Go"})
    )
    assert calls.outcomes == [("success", "Intent logged")] and calls.asked == []


@pytest.mark.parametrize("tool", FILE_TOOLS)
@pytest.mark.parametrize("way", ["dotdot", "absolute", "link", "linked_dir"])
async def test_b2_paths_outside_the_root_are_denied_before_anyone_is_asked(
    client: Client, root: Path, tool: str, way: str
) -> None:
    outside = root.parent / "outside"
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linked").symlink_to(outside)
    target = {
        "dotdot": "../outside" + ("" if tool == "glob" else "/secret.txt"),
        "absolute": str(outside if tool == "glob" else outside / "secret.txt"),
        "link": "linked" if tool == "glob" else "link.txt",
        "linked_dir": "linked" if tool == "glob" else "linked/secret.txt",
    }[way]
    calls = await run_calls(client, builtin_tools(root), (tool, arguments(tool, target)))
    assert calls.outcome == "denied"
    assert "is outside the working directory" in calls.text
    assert "SECRET" not in calls.text
    assert calls.asked == []  # nobody is asked to approve what will be refused
    assert (outside / "secret.txt").read_text() == "SECRET\n"


async def test_b2_a_link_swapped_in_after_approval_is_refused_when_the_call_runs(
    client: Client, root: Path
) -> None:
    """The path is checked again as the call runs: a link put in its place while the user
    was deciding does not lead the write out."""
    outside = root.parent / "outside"
    (root / "notes.txt").write_text("SECRET\n")

    def swap(request: Any) -> PermissionDecision:
        (root / "notes.txt").unlink()
        (root / "notes.txt").symlink_to(outside / "secret.txt")
        return PermissionDecision(kind="approve-once")

    edit = arguments("edit", "notes.txt")
    calls = await run_calls(client, builtin_tools(root), ("edit", edit), decide=swap)
    assert calls.outcome == "denied" and "outside the working directory" in calls.text
    assert (outside / "secret.txt").read_text() == "SECRET\n"


@pytest.mark.parametrize("tool", ["view", "create", "edit"])
async def test_b2_a_link_loop_fails_cleanly(client: Client, root: Path, tool: str) -> None:
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    calls = await run_calls(client, builtin_tools(root), (tool, arguments(tool, "a")))
    assert calls.outcome == "failure"
    assert "Too many levels of symbolic links" in calls.text or "already exists" in calls.text


async def test_b4_search_skips_links_that_lead_out(client: Client, root: Path) -> None:
    (root / "mine.txt").write_text("SECRET here\n")
    (root / "link.txt").symlink_to(root.parent / "outside" / "secret.txt")
    (root / "linked").symlink_to(root.parent / "outside")
    calls = await run_calls(
        client,
        builtin_tools(root),
        ("grep", {"pattern": "SECRET", "output_mode": "content"}),
        ("glob", {"pattern": "**/*.txt"}),
    )
    assert calls.outcomes == [
        ("success", "./mine.txt:SECRET here"),
        ("success", "./mine.txt"),
    ]


async def test_b3_view_create_edit_read_as_the_cli_does(client: Client, root: Path) -> None:
    (root / "lines.txt").write_text("line1\nline2\nline3\nline4\nline5\n")
    (root / "edit_me.txt").write_text("Hello World\nGoodbye World\n")
    (root / "sub").mkdir()
    (root / "sub" / "a.py").write_text("")
    (root / ".hidden").write_text("")
    calls = await run_calls(
        client,
        builtin_tools(root),
        ("view", {"path": f"{root}/lines.txt", "view_range": [2, 4]}),
        ("view", {"path": "lines.txt", "view_range": [4, -1]}),
        ("view", {"path": f"{root}/does_not_exist.txt"}),
        ("create", {"path": f"{root}/new_file.txt", "file_text": "Created by test"}),
        ("view", {"path": f"{root}/new_file.txt"}),
        ("edit", {"path": f"{root}/edit_me.txt", "old_str": "Hello World", "new_str": "Hi"}),
        ("view", {"path": "edit_me.txt"}),
        ("view", {"path": "."}),
    )
    assert calls.outcomes == [
        ("success", "2. line2\n3. line3\n4. line4"),
        ("success", "4. line4\n5. line5\n6."),
        ("failure", f"Path {root}/does_not_exist.txt does not exist. Please provide a valid path."),
        ("success", f"Created file {root}/new_file.txt with 15 characters"),
        ("success", "1. Created by test"),
        ("success", f"File {root}/edit_me.txt updated with changes."),
        ("success", "1. Hi\n2. Goodbye World\n3."),
        ("success", "edit_me.txt\nlines.txt\nnew_file.txt\nsub/\nsub/a.py"),
    ]


async def test_b3_edit_needs_exactly_one_match_and_create_a_new_file(
    client: Client, root: Path
) -> None:
    (root / "f.txt").write_text("a\nb\na\n")
    calls = await run_calls(
        client,
        builtin_tools(root),
        ("edit", {"path": "f.txt", "old_str": "zzz", "new_str": "y"}),
        ("edit", {"path": "f.txt", "old_str": "a", "new_str": "y"}),
        ("create", {"path": "f.txt", "file_text": "over"}),
        ("view", {"path": "f.txt", "view_range": [9, 10]}),
    )
    assert [o for o, _ in calls.outcomes] == ["failure"] * 4
    assert calls.outcomes[0][1].startswith(f"No match found for old_str in {root}/f.txt")
    assert "matches 2 places" in calls.outcomes[1][1] and "lines 1, 3" in calls.outcomes[1][1]
    assert calls.outcomes[2][1] == f"Path {root}/f.txt already exists. Use edit to change it."
    assert calls.outcomes[3][1] == f"Invalid view_range: {root}/f.txt has 3 lines."
    assert (root / "f.txt").read_text() == "a\nb\na\n"


async def test_b4_grep_and_glob_print_as_ripgrep_does(client: Client, root: Path) -> None:
    (root / "data.txt").write_text("apple\nbanana\napricot\ncherry\n")
    (root / "src").mkdir()
    (root / "src" / "index.ts").write_text("export const index = 1;")
    (root / "README.md").write_text("# Readme")
    calls = await run_calls(
        client,
        builtin_tools(root),
        (
            "grep",
            {"pattern": "^ap", "path": f"{root}/data.txt", "output_mode": "content", "-n": True},
        ),
        ("glob", {"pattern": "**/*.ts"}),
        ("grep", {"pattern": "an", "output_mode": "count"}),
        ("grep", {"pattern": "index"}),
        ("grep", {"pattern": "banana", "output_mode": "content", "-C": 1, "-n": True}),
        ("grep", {"pattern": "nothing"}),
        ("glob", {"pattern": "*.{md,ts}", "path": "src"}),
    )
    assert calls.outcomes == [
        ("success", f"{root}/data.txt:1:apple\n{root}/data.txt:3:apricot"),
        ("success", "./src/index.ts"),
        ("success", "./data.txt:1"),
        ("success", "./src/index.ts"),
        ("success", "./data.txt-1-apple\n./data.txt:2:banana\n./data.txt-3-apricot"),
        ("success", "No matches found."),
        ("success", "src/index.ts"),
    ]


async def test_b3_a_huge_file_is_shown_within_the_limit_in_bounded_memory(
    client: Client, root: Path
) -> None:
    lines = (f"line {i} " + "x" * 100 + "\n" for i in range(400_000))
    (root / "big.txt").write_text("".join(lines))
    (root / "one_line.txt").write_bytes(b"y" * 20_000_000)
    tracemalloc.start()
    try:
        calls = await run_calls(
            client,
            builtin_tools(root, output_limit=16_384),
            ("view", {"path": "big.txt"}),
            ("view", {"path": "one_line.txt"}),
            ("grep", {"pattern": "zzz"}),
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (big, big_text), (one, one_text), (grep, grep_text) = calls.outcomes
    assert big == one == grep == "success"
    assert big_text.startswith("1. line 0 ") and len(big_text) < 17_000
    assert big_text.endswith("[the output is cut at 16384 bytes: view a range from line 145]")
    assert one_text == "[the output is cut at 16384 bytes: view a range from line 1]"
    assert grep_text == "No matches found."
    assert peak < 8_000_000, peak  # neither 44 MB file nor the 20 MB line was held whole


@pytest.mark.parametrize("tool", FILE_TOOLS)
async def test_b7_a_denied_call_does_nothing(client: Client, root: Path, tool: str) -> None:
    (root / "f.txt").write_text("SECRET\n")
    calls = await run_calls(
        client,
        builtin_tools(root),
        (tool, arguments(tool, "new.txt" if tool == "create" else "f.txt")),
        decide=lambda request: PermissionDecision(kind="user-not-available"),
    )
    assert calls.outcomes == [
        ("denied", "Permission denied and could not request permission from user")
    ]
    assert (root / "f.txt").read_text() == "SECRET\n" and not (root / "new.txt").exists()


async def test_b7_permission_requests_take_the_cli_shapes(client: Client, root: Path) -> None:
    (root / "f.txt").write_text("one\n")
    calls = await run_calls(
        client,
        builtin_tools(root),
        ("view", {"path": "f.txt"}),
        ("grep", {"pattern": "x"}),
        ("create", {"path": "g.txt", "file_text": "new\n"}),
        ("edit", {"path": "f.txt", "old_str": "one", "new_str": "two"}),
    )
    wire = [r.model_dump(by_alias=True, exclude_none=True) for r in calls.asked]
    shown = [
        {k: w[k] for k in w if k not in ("toolDescription", "args", "requestId")} for w in wire
    ]
    for request in shown:
        assert request.pop("toolCallId")
    assert shown == [
        {
            "kind": "read",
            "toolName": "view",
            "path": f"{root}/f.txt",
            "intention": f"View {root}/f.txt",
        },
        {"kind": "read", "toolName": "grep", "path": str(root), "intention": f"Search {root}"},
        {
            "kind": "write",
            "toolName": "create",
            "fileName": f"{root}/g.txt",
            "diff": f"--- {root}/g.txt\n+++ {root}/g.txt\n@@ -0,0 +1 @@\n+new\n",
            "newFileContents": "new\n",
            "intention": f"Create {root}/g.txt",
            "canOfferSessionApproval": True,
        },
        {
            "kind": "write",
            "toolName": "edit",
            "fileName": f"{root}/f.txt",
            "diff": f"--- {root}/f.txt\n+++ {root}/f.txt\n@@ -1 +1 @@\n-one\n+two\n",
            "intention": f"Edit {root}/f.txt",
            "canOfferSessionApproval": True,
        },
    ]


def test_b2_the_root_may_itself_be_reached_through_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    (view,) = builtin_tools(tmp_path / "alias", names=["view"])
    assert view.validate({"path": os.fspath(tmp_path / "alias" / "x")}).path  # type: ignore[union-attr]


@pytest.mark.parametrize("tool", ["view", "edit", "grep"])
async def test_b3_a_fifo_is_refused_without_waiting_for_a_writer(
    client: Client, root: Path, tool: str
) -> None:
    os.mkfifo(root / "pipe")
    calls = await run_calls(client, builtin_tools(root), (tool, arguments(tool, "pipe")))
    shown = "pipe" if tool == "grep" else f"{root}/pipe"  # grep shows paths as given
    assert calls.outcomes == [("failure", f"{shown} is not a regular file.")]


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/*.ts", "src/index.ts", True),
        ("**/*.ts", "index.ts", True),
        ("*.ts", "a/b/c.ts", True),
        ("src/*.ts", "src/a/b.ts", False),
        ("src/**/*.ts", "src/a/b.ts", True),
        ("{*.md,src/*.ts}", "src/x.ts", True),
        ("[!a]*.py", "a.py", False),
        ("f?.py", "f/.py", False),
    ],
)
def test_b4_globs_read_as_ripgrep_reads_them(pattern: str, path: str, matches: bool) -> None:
    from trimtab.builtin._search import glob_pattern

    assert bool(glob_pattern(pattern).fullmatch(path)) is matches


@given(
    lines=st.lists(st.sampled_from(["a\n", "b\n", "c\n", "\n", "dd\n"]), min_size=1, max_size=30),
    start=st.integers(0, 29),
    length=st.integers(1, 4),
    new=st.sampled_from(["", "X\n", "Y", "p\nq\n"]),
    last_newline=st.booleans(),
)
def test_b7_an_edits_diff_is_the_whole_files_diff(
    lines: list[str], start: int, length: int, new: str, last_newline: bool
) -> None:
    """The diff of a write request is computed over the changed lines only, and reads as
    the diff of the whole file would."""
    import difflib

    from trimtab.builtin._files import _edit_diff

    numbered = [f"{i}{line}" for i, line in enumerate(lines)]  # each line unique
    if not last_newline:
        numbered[-1] = numbered[-1].rstrip("\n")
    before = "".join(numbered)
    start = min(start, len(numbered) - 1)
    old = "".join(numbered[start : start + length])
    after = before.replace(old, new, 1)
    whole = difflib.unified_diff(before.splitlines(True), after.splitlines(True), "f", "f")
    assert _edit_diff("f", before, old, new) == "".join(whole)
