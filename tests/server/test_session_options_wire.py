"""Spec D15 over `trimtab serve`: the wire's session options are `SessionOptions` by their
camelCase names, the names the official client sends, and trimtab's remote client sends every
option that has a wire form."""

from __future__ import annotations

import ast
import inspect
import warnings
from pathlib import Path
from typing import Any

import copilot.client
from copilot import CopilotClient

from tests.server.conftest import StartServer
from trimtab import SessionOptions
from trimtab.events import (
    InfiniteSessions,
    ModelLimits,
    SessionConfigData,
    SessionStartEvent,
    ToolSearch,
)
from trimtab.protocol.wire import CreateParams, ResumeParams, SessionOptionsParams
from trimtab.store import open_store

PROVIDER = {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"}
"""Never called: these sessions only open."""

EXTENSIONS = frozenset(
    {
        "developerMessages",
        "maxTurns",
        "modelLimits",
        "contextOverflow",
        "handoff",
        "recall",
        "budget",
        "structuredOutput",
    }
)
"""trimtab's own fields of `session.create` and `session.resume` (spec D15)."""

CLAIMED = frozenset(
    {
        "sessionId",
        "model",
        "reasoningEffort",
        "provider",
        "tools",
        "systemMessage",
        "streaming",
        "clientName",
        "availableTools",
        "excludedTools",
        "defaultAgent",
        "infiniteSessions",
        "toolSearch",
        "requestPermission",
        "hooks",
        "mcpServers",
        "workingDirectory",
        "requestUserInput",
        "sessionLimits",
    }
)
"""The official client's fields the spec says trimtab honours (D1, D9, D10, D12, D15, MCP9,
B8, B9, U6)."""

NOT_TAKEN = frozenset(
    {
        # What the session reads from disk: the Copilot CLI's workspace.
        "additionalDirectories",
        "configDir",
        "trustWorkingDirectory",
        "sandboxConfig",
        "envValueMode",
        # Agents, skills, plugins, instructions and their directories.
        "agent",
        "customAgents",
        "customAgentsLocalOnly",
        "excludedBuiltinAgents",
        "agentDirectories",
        "skillDirectories",
        "disabledSkills",
        "enableSkills",
        "hasSkillProvider",
        "pluginDirectories",
        "hookDirectories",
        "enableFileHooks",
        "instructionDirectories",
        "organizationCustomInstructions",
        "refreshCustomInstructions",
        "enableOnDemandInstructionDiscovery",
        "enableConfigDiscovery",
        "skipEmbeddingRetrieval",
        "embeddingCacheStorage",
        # Models and providers beyond the one BYOK provider.
        "providers",
        "models",
        "modelCapabilities",
        "capi",
        "contextTier",
        "reasoningSummary",
        "isExperimentalMode",
        "autopilot",
        # Questions the runtime may ask the client, and UI extensions.
        "askUserVariant",
        "requestElicitation",
        "requestExitPlanMode",
        "requestAutoModeSwitch",
        "requestMcpApps",
        "requestCanvasRenderer",
        "requestExtensions",
        "canvases",
        "canvasProvider",
        "openCanvases",
        "extensionInfo",
        "extensionSdkPath",
        "commands",
        # GitHub, MCP authentication, managed settings and telemetry.
        "gitHubToken",
        "gitHubTokenProviderRegistrationId",
        "githubMcpToolConfig",
        "authClientIdMetadataUrl",
        "mcpOAuthTokenStorage",
        "disabledMcpServers",
        "managedSettings",
        "enableManagedSettings",
        "excludedManagedSettings",
        "enforceManagedModelDefaults",
        "featureFlags",
        "expAssignments",
        "enableSessionTelemetry",
        "enableGitHubTelemetryForwarding",
        "diagnostics",
        # What the session keeps and shows beyond its event log.
        "name",
        "memory",
        "largeOutput",
        "imageGeneration",
        "enableCitations",
        "enableFileChangeTracking",
        "enableSessionStore",
        "enableHostGitOperations",
        "includeSubAgentStreamingEvents",
        "interactiveUser",
        "toolFilterPrecedence",
        "cloud",
        "disableResume",
        "allowTranscriptRecovery",
    }
)
"""What the official client (`github-copilot-sdk` 1.0.27) may send that trimtab ignores, as the
protocol lets a runtime do with fields it has no use for."""


def official_fields(method: str) -> set[str]:
    """The fields of the official client's `session.create` or `session.resume` request, read
    from the source of its `create_session` / `resume_session`: the keys of the `payload`
    literal it starts from and of every `payload["key"] = ...`."""
    tree = ast.parse(inspect.getsource(copilot.client.CopilotClient))
    [builder] = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef) and node.name == method
    ]
    fields: set[str] = set()
    for node in ast.walk(builder):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "payload"
            and isinstance(node.slice, ast.Constant)
        ):
            fields.add(str(node.slice.value))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Dict):
            if isinstance(node.target, ast.Name) and node.target.id == "payload":
                fields |= {
                    str(key.value) for key in node.value.keys if isinstance(key, ast.Constant)
                }
    assert len(fields) > 50, f"the official client's {method} was not found as expected"
    return fields


def trimtab_fields(params: type[SessionOptionsParams]) -> set[str]:
    """The fields trimtab reads: the params' own and the options that are data."""
    declared = {field.alias or name for name, field in params.model_fields.items()}
    options = {
        field.alias or name
        for name, field in SessionOptions.model_fields.items()
        if not field.exclude
    }
    return declared | options


def test_d15_trimtabs_wire_names_are_the_official_clients_or_its_own() -> None:
    for method, params in (("create_session", CreateParams), ("resume_session", ResumeParams)):
        official, ours = official_fields(method), trimtab_fields(params)
        assert ours - official == EXTENSIONS, method  # a misspelt field reads nothing
        assert CLAIMED <= ours & official, method
        ignored = official - ours
        assert not NOT_TAKEN & ours, "taken now: remove it from NOT_TAKEN"
        if ignored - NOT_TAKEN:
            # Not a failure (the protocol ignores them), but worth a look.
            warnings.warn(
                f"the official client's {method} sends fields trimtab does not take: "
                f"{sorted(ignored - NOT_TAKEN)}",
                stacklevel=1,
            )


def test_d15_a_misspelt_field_would_be_caught() -> None:
    """The check above can fail: a field spelt otherwise than the official client's is seen."""

    class Misspelt(CreateParams):
        infinite_session: bool = False

    assert trimtab_fields(Misspelt) - official_fields("create_session") == {
        *EXTENSIONS,
        "infiniteSession",
    }


async def logged_config(store: Path, session_id: str) -> SessionConfigData:
    opened = open_store(store)
    try:
        start = (await opened.read(session_id))[0]
    finally:
        await opened.close()
    assert isinstance(start, SessionStartEvent)
    return start.data.config


async def test_d15_the_official_clients_options_are_read_as_trimtabs(
    start_server: StartServer, tmp_path: Path
) -> None:
    """Before D15, `toolSearch` from an official client was ignored."""
    server = start_server(tmp_path / "trimtab.db")
    client = CopilotClient(connection=server.connection())
    await client.start()
    try:
        session = await client.create_session(
            provider=PROVIDER,  # type: ignore[arg-type]
            model="test-model",
            reasoning_effort="high",
            streaming=True,
            tool_search={"enabled": False, "defer_threshold": 3},
            infinite_sessions={"enabled": True, "background_compaction_threshold": 0.6},
        )
        session_id = session.session_id
        await session.disconnect()
    finally:
        await client.force_stop()
    config = await logged_config(tmp_path / "trimtab.db", session_id)
    assert (config.model, config.reasoning_effort, config.streaming) == ("test-model", "high", True)
    assert (config.tool_search.enabled, config.tool_search.defer_threshold) == (False, 3)
    assert (config.infinite_sessions.enabled, config.infinite_sessions.threshold) == (True, 0.6)


async def test_d15_the_remote_client_sends_every_option_with_a_wire_form(
    start_server: StartServer, tmp_path: Path
) -> None:
    """Before D15, `Client.connect`'s sessions refused these with `TypeError`."""
    server = start_server(tmp_path / "trimtab.db")
    options: dict[str, Any] = {
        "model_limits": {"context_window": 5000, "max_output_tokens": 200},
        "tool_search": {"enabled": False, "defer_threshold": 3},
        "infinite_sessions": {"enabled": True, "threshold": 0.6},
        "developer_messages": ["dev"],
    }
    async with server.remote() as remote:
        session = await remote.create_session(provider=PROVIDER, **options)
        events = await session.get_events()
        await session.disconnect()
    start = events[0]
    assert isinstance(start, SessionStartEvent)
    config = start.data.config
    assert config.model_limits == ModelLimits(context_window=5000, max_output_tokens=200)
    assert config.tool_search == ToolSearch(enabled=False, defer_threshold=3)
    assert config.infinite_sessions == InfiniteSessions(enabled=True, threshold=0.6)
    assert config.developer_messages == ["dev"]
