"""End to end with the real embedded model (SmolLM2-135M through llama.cpp), through `Client`.

The model is small and its words are not the point: these tests assert structure (one model
call, schema-valid arguments, the clear and its seeded run, the tool result in the next
request). Skipped when llama-cpp-python is not installed (`tests/requirements.py`).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from tests.conftest import ClearArgs, Recorder, clear_tool
from tests.requirements import require_llama_cpp, require_weights
from trimtab import Client, PermissionHandler, Session, SessionError, Tool, define_tool
from trimtab.providers import ModelRequest, ProviderConfig, ProviderEvent
from trimtab.providers.local import LocalProvider

require_llama_cpp()

SYSTEM = "You are a helpful assistant."


class AddArgs(BaseModel):
    a: float
    b: float


class Recording:
    """The shared model, recording each request; closing it leaves the model loaded."""

    name = "local"
    native_output = True

    def __init__(self, provider: LocalProvider) -> None:
        self._provider = provider
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        async for event in self._provider.stream(request):
            yield event

    async def aclose(self) -> None:
        pass  # the module's fixture closes the model once, after the last test


@pytest.fixture(scope="module")
def local_provider() -> Iterator[LocalProvider]:
    """One provider for the module, so that the model is loaded once."""
    provider = LocalProvider(ProviderConfig(type="local"))
    yield provider
    asyncio.run(provider.aclose())


@pytest.fixture
def model(local_provider: LocalProvider) -> Recording:
    return Recording(local_provider)


async def open_local(client: Client, model: Recording, *tools: Tool) -> Session:
    return await client.create_session(
        provider=model,
        system_message=SYSTEM,
        tools=list(tools),
        streaming=True,
        on_permission_request=PermissionHandler.approve_all,
    )


async def test_plain_answer_is_text_from_one_model_call(model: Recording) -> None:
    async with Client(store="memory") as client:
        session = await open_local(client, model)
        rec = Recorder(session)
        reply = await session.send_and_wait("What is the capital of France?")

    assert reply is not None and reply.data.content.strip()
    assert not reply.data.tool_requests
    assert len(model.requests) == 1
    deltas = "".join(e.data.delta_content for e in rec.of("assistant.message_delta"))
    assert deltas == reply.data.content
    usage = rec.of("assistant.usage")[0].data
    assert usage.input_tokens and usage.input_tokens > 0
    assert usage.output_tokens and usage.output_tokens > 0
    assert rec.types.count("session.idle") == 1


async def test_clear_context_call_is_schema_valid_clears_and_runs_the_seed(
    model: Recording,
) -> None:
    async with Client(store="memory") as client:
        session = await open_local(client, model, clear_tool(), add_tool())
        rec = Recorder(session)
        reply = await session.send_and_wait("Call clear_context with prompt 'Say hello.'")

    [start] = rec.of("tool.execution_start")
    assert start.data.tool_name == "clear_context"
    seed = ClearArgs.model_validate(start.data.arguments).prompt
    assert seed.strip()
    [complete] = rec.of("tool.execution_complete")
    assert complete.data.outcome == "success"
    [cleared] = rec.of("session.context_cleared")
    assert cleared.data.initial_message == seed
    assert [e.data.source for e in rec.of("user.message")] == ["user", "context_cleared"]
    # The seeded run: a second model call on the fresh window, answered in text.
    assert len(model.requests) == 2
    fresh = [(m.role, m.content) for m in model.requests[1].messages]
    assert fresh == [("system", SYSTEM), ("user", seed)]
    assert reply is not None and reply.data.content.strip() and not reply.data.tool_requests
    assert rec.types.count("session.idle") == 1
    assert rec.types[-1] == "session.idle"


async def test_named_tool_gets_valid_arguments_and_its_result_reaches_the_model(
    model: Recording,
) -> None:
    calls: list[AddArgs] = []

    def add(params: AddArgs) -> str:
        calls.append(params)
        return f"The sum is {params.a + params.b:g}."

    async with Client(store="memory") as client:
        session = await open_local(client, model, clear_tool(), add_tool(add))
        rec = Recorder(session)
        reply = await session.send_and_wait("Use add to add 2 and 3.")

    assert len(calls) == 1  # the handler got arguments that passed AddArgs
    [complete] = rec.of("tool.execution_complete")
    assert complete.data.outcome == "success"
    result = f"The sum is {calls[0].a + calls[0].b:g}."
    assert len(model.requests) == 2
    last = model.requests[1].messages[-1]
    assert (last.role, last.content) == ("tool", result)
    assert reply is not None and reply.data.content.strip() and not reply.data.tool_requests
    assert rec.types.count("session.idle") == 1


async def test_unnamed_tool_choice_is_a_reply_or_a_valid_call(model: Recording) -> None:
    """With tools offered and none named, the model's constrained pick is valid either way;
    a terminal tool is never picked unless named."""
    async with Client(store="memory") as client:
        session = await open_local(client, model, clear_tool(), add_tool())
        rec = Recorder(session)
        reply = await session.send_and_wait("What is 2 plus 3?")

    for start in rec.of("tool.execution_start"):
        assert start.data.tool_name == "add"
        try:
            AddArgs.model_validate(start.data.arguments)
        except ValidationError as exc:  # pragma: no cover - the failure message
            pytest.fail(f"invalid arguments: {exc}")
    assert len(model.requests) == 1 + len(rec.of("tool.execution_start"))
    assert reply is not None and reply.data.content.strip()
    assert rec.types.count("session.idle") == 1


class Sum(BaseModel):
    a: int
    b: int
    total: int


@pytest.mark.parametrize("mode", ["tool", "native"])
async def test_out2_out6_the_embedded_model_gives_a_typed_result_at_its_first_try(
    model: Recording, mode: str
) -> None:
    """Its grammar makes the result valid: the output tool's arguments (a call is required,
    and the lone tool is called without asking) or the reply (native) follow the schema."""
    require_weights()
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model, system_message=SYSTEM, structured_output=mode
        )
        result = await session.send_and_wait("Add 2 and 3.", output_type=Sum)
        log = await session.get_events()

    assert isinstance(result, Sum)
    assert len(model.requests) == 1  # valid at once: no retry
    [request] = model.requests
    if mode == "tool":
        assert request.tool_choice == "required" and [t.name for t in request.tools] == [
            "final_result"
        ]
        assert [e.data.outcome for e in log if e.type == "tool.execution_complete"] == ["success"]
    else:
        assert request.output_schema is not None and not request.tools
        assert [e for e in log if e.type == "assistant.message"][-1].data.output is not None


async def test_abort_stops_the_generation_without_waiting_for_it(model: Recording) -> None:
    async with Client(store="memory") as client:
        session = await open_local(client, model)
        rec = Recorder(session)
        await session.send("Write a very long story about a dragon and a knight.")
        await rec.wait_for("assistant.message_delta", timeout=60)
        started = asyncio.get_running_loop().time()
        await session.abort()
        await rec.wait_for("session.idle")
        # A whole reply (up to 512 tokens) takes seconds; stopping takes one token.
        assert asyncio.get_running_loop().time() - started < 1.0
        # The model is free again (a fresh session: the story would still be in this window).
        other = await open_local(client, model)
        reply = await other.send_and_wait("Say hello.")
        assert reply is not None and reply.data.content.strip()


async def test_a_file_that_is_not_a_model_fails_the_run_with_a_provider_error(
    tmp_path: Path,
) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"not a model")
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider={"type": "local", "model_path": str(weights)}
        )
        with pytest.raises(SessionError) as caught:
            await session.send_and_wait("Hello")
    assert caught.value.error_type == "provider_unavailable"
    assert "cannot load" in caught.value.message


def add_tool(handler: Callable[[AddArgs], object] | None = None) -> Tool:
    return define_tool(
        "add",
        description="Add two numbers",
        params_type=AddArgs,
        handler=handler or (lambda params: params.a + params.b),
    )


LONG_SYSTEM = (
    "You are a helpful assistant for a small bookshop. Answer in one or two sentences. "
    "The shop opens at nine and closes at six, Monday to Saturday; it is closed on Sundays. "
    "It sells new and second-hand books, maps and postcards, and orders any book in print "
    "within three days. Customers may return a book within thirty days with its receipt. "
    "There is a reading corner with tea, a children's corner with picture books, and a "
    "book club that meets on the first Thursday of every month to discuss a novel. "
    "Never make up prices: say that the staff will tell them."
)
"""A system prompt of the size real ones have, so that the history, not the newest turn,
makes most of every prompt."""


def generations(provider: LocalProvider) -> int:
    """How many generations the provider's model has made."""
    engine = provider._engine
    assert engine is not None
    return engine.counters.generations


def reads(provider: LocalProvider, since: int) -> list[tuple[int, int]]:
    """(prompt tokens, tokens read) of the model's generations after the first `since`."""
    engine = provider._engine
    assert engine is not None
    recent = list(engine.counters.recent)
    return recent[len(recent) - (engine.counters.generations - since) :]


async def test_a_turn_with_tools_offered_reads_only_what_is_new(
    local_provider: LocalProvider, model: Recording
) -> None:
    """Issue 20 item 4: every step of a later turn (the tool choice, the reply) reuses the
    model's state of the conversation so far instead of reading it again."""
    async with Client(store="memory") as client:
        session = await client.create_session(
            provider=model,
            system_message=LONG_SYSTEM,
            tools=[add_tool()],
            on_permission_request=PermissionHandler.approve_all,
        )
        await session.send_and_wait("When do you open on Saturdays?")
        await session.send_and_wait("Can I return a book I bought last week?")
        before = generations(local_provider)
        await session.send_and_wait("Is there a book club?")
        last_turn = reads(local_provider, before)

    assert last_turn, "the turn made no generation"
    for prompt, read in last_turn:
        # The system prompt and two turns make most of each prompt: they are not read again.
        assert read < prompt / 2, (prompt, read, last_turn)


async def test_sessions_taking_turns_on_one_model_each_resume_their_own_state(
    local_provider: LocalProvider, model: Recording
) -> None:
    """Issue 20 item 4: a session's turn that replaced another session's state in the model
    leaves that state saved, and the other session's next turn restores it."""
    async with Client(store="memory") as client:
        first, second = [
            await client.create_session(provider=model, system_message=f"{LONG_SYSTEM} {name}")
            for name in ("You serve the shop's counter.", "You answer the shop's phone.")
        ]
        await first.send_and_wait("When do you open on Saturdays?")
        await second.send_and_wait("Do you sell maps?")
        engine = local_provider._engine
        assert engine is not None
        restored = engine.counters.restored
        before = generations(local_provider)
        await first.send_and_wait("And on Sundays?")
        await second.send_and_wait("Can you order a book for me?")
        resumed = reads(local_provider, before)

    assert engine.counters.restored - restored == 2  # each session got its own state back
    for prompt, read in resumed:
        assert read < prompt / 2, (prompt, read, resumed)


async def test_providers_of_one_model_file_share_one_loaded_model(
    local_provider: LocalProvider,
) -> None:
    """Issue 20 item 4: the model is loaded once per process, whatever uses it."""
    loaded = await asyncio.to_thread(local_provider._load)
    other = LocalProvider(ProviderConfig(type="local"))
    try:
        assert await asyncio.to_thread(other._load) is loaded
    finally:
        await other.aclose()
    # The first provider still has it, usable.
    assert local_provider._engine is loaded
    async with Client(store="memory") as client:
        session = await client.create_session(provider=Recording(local_provider))
        reply = await session.send_and_wait("Say hello.")
    assert reply is not None and reply.data.content.strip()


def test_a_long_first_prompt_is_answered_in_a_process_of_its_own() -> None:
    # llama.cpp's AMX kernel crashed the process at a first prompt of a few dozen tokens on
    # Sapphire Rapids machines (ggml-org/llama.cpp#20824): the model is loaded without it
    # there. In a process of its own, so that a crash fails this test, not the whole run.
    code = (
        "import asyncio\n"
        "from trimtab.providers import Message, ModelRequest, ProviderConfig\n"
        "from trimtab.providers.local import LocalProvider, default_model_path\n"
        "async def main():\n"
        "    provider = LocalProvider(ProviderConfig(type='local'))\n"
        "    text = 'Tell me a long story about a cat and a dog who become friends. ' * 12\n"
        "    request = ModelRequest(model='local', messages=(Message(role='user', content=text),),"
        " max_tokens=4)\n"
        "    events = [e async for e in provider.stream(request)]\n"
        "    await provider.aclose()\n"
        "    print(type(events[-1]).__name__)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ModelResponse"


def test_em1_a_texts_score_is_its_tokens_log_probability(local_provider: LocalProvider) -> None:
    """The one-pass score of a message equals the sum, token by token, of the log-probability
    the model gives each of its tokens (and the turn's end) after those before it."""
    import numpy as np

    engine = local_provider._load()
    text = "What time is it in Tokyo?"
    chat = [{"role": "system", "content": "Tells the time."}, {"role": "user", "content": text}]
    [score] = engine.likelihoods([chat], text).log_likelihoods

    llama = engine._llama
    rendered = engine._template.render(chat)
    tokens = engine._tokens(rendered)
    before = engine._tokens(rendered[: rendered.rindex(text)])
    start = len(before)
    assert tokens[:start] == before  # the message starts a token of its own
    expected = 0.0
    with engine.lock:
        for position in range(start, len(tokens)):
            llama.reset()
            llama._ctx.kv_cache_seq_rm(0, -1, -1)
            llama.eval(tokens[:position])
            logits = np.ctypeslib.as_array(llama._ctx.get_logits(), shape=(llama.n_vocab(),))
            values = logits.astype(np.float64)
            top = values.max()
            expected += values[tokens[position]] - top - np.log(np.exp(values - top).sum())
        llama.reset()  # the engine's saved states stay valid: the model holds nothing now
        llama._ctx.kv_cache_seq_rm(0, -1, -1)
    assert score == pytest.approx(expected, abs=1e-2)
    assert len(tokens) - start > 5  # the message's tokens were scored, not just its end


@pytest.mark.parametrize(
    ("message", "tool"),
    [
        ("What time is it in Tokyo?", "current_time"),
        ("Quelle heure est-il ?", "current_time"),
        ("What is 17 * 23?", "calculator"),
        ("What is the capital of France?", None),
        # The prompts a clear seeds, as the fresh run sees them: a plain answer has several
        # kinds (help, conversation, writing), and the best of them is what a tool must beat.
        ("Say hello.", None),
        ("Write a haiku about rain.", None),
    ],
)
async def test_em1_an_unnamed_tool_is_called_when_its_description_explains_the_message(
    model: Recording, message: str, tool: str | None
) -> None:
    from trimtab.cli.demo_tools import demo_tools

    async with Client(store="memory") as client:
        session = await open_local(client, model, *demo_tools())
        rec = Recorder(session)
        await session.send_and_wait(message)
    assert [start.data.tool_name for start in rec.of("tool.execution_start")][:1] == (
        [tool] if tool else []
    )


def test_a_saved_state_the_next_save_drops_is_not_restored(
    local_provider: LocalProvider,
) -> None:
    """The state a prompt would restore can be dropped by the save made just before: one the
    state being saved extends (the same conversation, its reply re-tokenized). Restoring it
    then failed the turn (`KeyError`); now the prompt is read from what remains."""
    from trimtab.providers._local_states import SAVE_FROM, PromptStates

    engine = local_provider._load()
    llama = engine._llama
    shared = list(range(1000, 1036))  # a conversation's first turns, ...
    first_reply = [2001, 2002, 2003, 2004]  # ... the end of its reply as first written, ...
    reread = [2101, 2102, 2103, 2104]  # ... and as the next turn re-tokenized it
    later = list(range(3000, 3000 + SAVE_FROM + 8))
    other = list(range(4000, 4000 + SAVE_FROM + 4))

    def turn(states: PromptStates, prompt: list[int]) -> None:
        keep = states.prepare(prompt).reused
        llama.eval(prompt[keep:])
        states.finished(reply=True)

    with engine.lock:
        states = PromptStates(llama, budget=1 << 30)
        try:
            turn(states, shared + first_reply)
            turn(states, other)  # another conversation: the first one's state is saved
            turn(states, shared + reread + later)  # restored, then goes on much longer
            # A prompt closer to the first saved state than to what the model holds: the
            # longer conversation is saved first, and it drops that state.
            reuse = states.prepare([*shared, *first_reply, 5000, 5001])
            assert not reuse.restored and reuse.saved
            assert reuse.reused == len(shared)  # the prefix the model holds is kept
        finally:
            llama.reset()
            llama._ctx.kv_cache_seq_rm(0, -1, -1)
