"""LangChain models backed by lookupspec: :class:`LookupspecLLM` (text completion) and
:class:`ChatLookupspec` (chat), in-process or against a ``lookupspec serve`` gateway.

Both are thin adapters over :mod:`lookupspec.client`; the output is exactly what the target model
alone would produce, only faster. Each result carries the speculation statistics
(:data:`lookupspec.stats.SPECULATION_KEYS`) and the token usage: ``generation_info`` for the LLM,
``response_metadata`` (plus ``usage_metadata``) for the chat model, also on the last streamed chunk::

    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from lookupspec.integrations.langchain import ChatLookupspec

    chat = ChatLookupspec(model="smollm2-135m-instruct", max_tokens=128)  # loads the model here
    # chat = ChatLookupspec(base_url="http://127.0.0.1:8000", api_key="sk-...")  # or a gateway
    chat.get_client().add_documents("manuals", [{"id": "m1", "text": manual_text}])
    prompt = ChatPromptTemplate.from_messages([("system", "Answer from the manual."), ("human", "{q}")])
    chain = prompt | chat.bind(collections=["manuals"]) | StrOutputParser()
    print(chain.invoke({"q": "How do I reset the device?"}))
    message = chat.invoke("Summarize: ...", documents=[source_text])  # draft from an inline document
    print(message.response_metadata["speculation"]["acceptance_length"], message.usage_metadata)

Per-call keyword arguments override the generation options (``max_tokens``, ``temperature``,
``top_p``, ``top_k``, ``seed``, ``collections``, ``documents``, ``speculation``, ``max_draft_tokens``,
``sources``); any other keyword is a ``TypeError``. Server-side refusals (an unknown collection, a bad
parameter) raise :class:`lookupspec.client.ClientError`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from lookupspec.client import Client, Delta, GenerationRequest, Lookup, Result, connect

try:
    from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
    from langchain_core.language_models import LanguageModelInput
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.language_models.llms import LLM
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        UsageMetadata,
    )
    from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
    from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
    from langchain_core.outputs import (
        ChatGeneration,
        ChatGenerationChunk,
        ChatResult,
        Generation,
        GenerationChunk,
        LLMResult,
    )
    from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:  # pragma: no cover - exercised by a test that hides langchain_core
    raise ImportError("lookupspec.integrations.langchain needs langchain-core: "
                      "pip install 'lookupspec[langchain]'") from exc

__all__ = ["ChatLookupspec", "LookupspecLLM"]

_CLIENT_LOCK = threading.Lock()  # guards the lazy client creation (a model load must happen once)


class _Options(BaseModel):
    """The generation options: fields of both models, and the per-call keyword arguments."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(default=256, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)  # None: 1.0, as in the HTTP API; 0: greedy
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    collections: list[str] = Field(default_factory=list)  # named document collections to draft from
    documents: list[str] = Field(default_factory=list)  # inline texts to draft from, this request only
    speculation: bool = True  # False: plain decoding (same output, no drafts)
    max_draft_tokens: int | None = Field(default=None, ge=0)
    sources: list[str] | None = None  # draft sources ("context", "corpus", "output", ...); None: all
    # OpenAI's fields (docs/structured-outputs.md); bind_tools / with_structured_output set them
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None

    def request(self, stop: list[str] | None, *, prompt: str | None = None,
                messages: list[dict[str, Any]] | None = None) -> GenerationRequest:
        lookup = Lookup(enabled=self.speculation, collections=tuple(self.collections),
                        documents=tuple(self.documents), max_draft_tokens=self.max_draft_tokens,
                        sources=None if self.sources is None else tuple(self.sources))
        return GenerationRequest(prompt=prompt, messages=messages, max_tokens=self.max_tokens,
                                 temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                 seed=self.seed, stop=tuple(stop or ()), lookup=lookup,
                                 response_format=self.response_format, tools=self.tools,
                                 tool_choice=self.tool_choice, logprobs=self.logprobs,
                                 frequency_penalty=self.frequency_penalty,
                                 presence_penalty=self.presence_penalty,
                                 repetition_penalty=self.repetition_penalty, logit_bias=self.logit_bias,
                                 min_tokens=self.min_tokens)


class _Lookupspec(_Options):
    """Where requests go, plus the options. Exactly one backend: ``client``, ``base_url`` (a gateway;
    ``model`` then names the served model, default its first) or ``model`` alone (loaded in-process,
    a path or a named default; ``client_kwargs`` go to :meth:`lookupspec.text.TextEngine.load`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = Field(default=None, repr=False, exclude=True)  # kept out of traces and dumps
    client_kwargs: dict[str, Any] = Field(default_factory=dict)
    client: Client | None = Field(default=None, exclude=True)
    _created: Client | None = PrivateAttr(default=None)  # the lazily created client

    @model_validator(mode="after")
    def _check_backend(self) -> _Lookupspec:
        if self.client is None and self.base_url is None and self.model is None:
            raise ValueError("pass model= (in-process), base_url= (a gateway) or client=")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s):// URL, got {self.base_url!r}")
        return self

    def get_client(self) -> Client:
        """The client requests use, created on first use and kept (an in-process model loads once).
        Add documents to collections through it: in-process, collections live in this client."""
        if self.client is not None:
            return self.client
        with _CLIENT_LOCK:
            if self._created is None:
                self._created = connect(self.base_url or self.model, api_key=self.api_key, model=self.model,
                                        **self.client_kwargs)
            return self._created

    async def _aget_client(self) -> Client:
        if self.client is not None or self._created is not None:
            return self.get_client()
        return await asyncio.to_thread(self.get_client)  # a model load must not block the event loop

    def close(self) -> None:
        """Close the client this object created (never a ``client=`` passed in)."""
        client, self._created = self._created, None
        if client is not None:
            client.close()

    def _options(self, kwargs: dict[str, Any]) -> _Options:
        unknown = sorted(set(kwargs) - set(_Options.model_fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown keyword argument(s) {', '.join(unknown)}; "
                            f"per-call options are {', '.join(_Options.model_fields)}")
        current = {name: getattr(self, name) for name in _Options.model_fields}
        return _Options.model_validate({**current, **kwargs})

    @property
    def _identifying_params(self) -> dict[str, Any]:
        # Inline documents are left out: they can be long, and they never change the output.
        return {"model": self.model, "base_url": self.base_url,
                **self._options({}).model_dump(exclude={"documents"})}


def _info(client: Client, finish_reason: str | None, usage: dict[str, int] | None,
          speculation: dict[str, Any] | None) -> dict[str, Any]:
    return {"finish_reason": finish_reason, "model_name": client.model, "usage": dict(usage or {}),
            "speculation": dict(speculation or {})}


def _usage_metadata(usage: dict[str, int] | None) -> UsageMetadata:
    usage = usage or {}
    return UsageMetadata(input_tokens=usage.get("prompt_tokens", 0),
                         output_tokens=usage.get("completion_tokens", 0),
                         total_tokens=usage.get("total_tokens", 0))


class LookupspecLLM(_Lookupspec, LLM):
    """A LangChain text-completion LLM; see the module docstring."""

    model_config = ConfigDict(extra="forbid")  # LangChain's base says "ignore": a typo must not pass

    @property
    def _llm_type(self) -> str:
        return "lookupspec"

    def _generation(self, client: Client, result: Result) -> Generation:
        return Generation(text=result.text, generation_info=_info(client, result.finish_reason,
                                                                  result.usage, result.speculation))

    def _chunk(self, client: Client, delta: Delta) -> GenerationChunk:
        if delta.finish_reason is None:
            return GenerationChunk(text=delta.text)
        info = _info(client, delta.finish_reason, delta.usage, delta.speculation)
        return GenerationChunk(text=delta.text, generation_info=info)

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        requests = [self._options(kwargs).request(stop, prompt=p) for p in prompts]
        client = self.get_client()
        return LLMResult(generations=[[self._generation(client, client.complete(r))] for r in requests])

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> LLMResult:
        requests = [self._options(kwargs).request(stop, prompt=p) for p in prompts]
        client = await self._aget_client()
        # One after another: in-process requests queue on one engine anyway, and a failure must not
        # leave sibling generations running behind the caller's back.
        return LLMResult(generations=[[self._generation(client, await client.acomplete(r))]
                                      for r in requests])

    def _call(self, prompt: str, stop: list[str] | None = None,
              run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> str:
        return self._generate([prompt], stop, run_manager, **kwargs).generations[0][0].text

    async def _acall(self, prompt: str, stop: list[str] | None = None,
                     run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> str:
        return (await self._agenerate([prompt], stop, run_manager, **kwargs)).generations[0][0].text

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[GenerationChunk]:
        request = self._options(kwargs).request(stop, prompt=prompt)
        client = self.get_client()
        for delta in client.stream(request):
            chunk = self._chunk(client, delta)
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        request = self._options(kwargs).request(stop, prompt=prompt)
        client = await self._aget_client()
        async for delta in client.astream(request):
            chunk = self._chunk(client, delta)
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk


def _message_dict(message: BaseMessage) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if isinstance(message, ChatMessage):
        role = message.role
    elif isinstance(message, SystemMessage):
        role = "system"
    elif isinstance(message, HumanMessage):
        role = "user"
    elif isinstance(message, AIMessage):
        role = "assistant"
        if message.tool_calls:
            extra["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": json.dumps(c["args"])}}
                                   for c in message.tool_calls]
    elif isinstance(message, ToolMessage):
        role = "tool"
        extra["tool_call_id"] = message.tool_call_id
    else:
        raise ValueError(f"ChatLookupspec accepts system, human, AI, tool and chat messages, not "
                         f"{type(message).__name__}")
    if isinstance(message.content, str):
        return {"role": role, "content": message.content, **extra}
    parts = []
    for block in message.content:
        if isinstance(block, str):
            parts.append(block)
        elif block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            raise ValueError(f"ChatLookupspec accepts text content only, not a {block.get('type')!r} block")
    return {"role": role, "content": "".join(parts), **extra}


def _message_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [_message_dict(m) for m in messages]


class ChatLookupspec(_Lookupspec, BaseChatModel):
    """A LangChain chat model (the model's chat template applies); see the module docstring."""

    model_config = ConfigDict(extra="forbid")  # LangChain's base says "ignore": a typo must not pass

    @property
    def _llm_type(self) -> str:
        return "lookupspec-chat"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | dict[str, Any] | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` (pydantic models, functions, LangChain tools or OpenAI dicts). ``tool_choice``:
        "auto" (the model's chat template must take tools), "required"/"any", or a tool's name; with a
        template that takes no tools, the default is "required"."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice == "any":
            tool_choice = "required"
        elif isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
            tool_choice = {"type": "function", "function": {"name": tool_choice}}
        if tool_choice is None:
            tool_choice = "required"
        return super().bind(tools=formatted, tool_choice=tool_choice, **kwargs)

    def with_structured_output(self, schema: Any, *, method: str = "json_schema", include_raw: bool = False,
                               **kwargs: Any) -> Runnable[LanguageModelInput, Any]:
        """Outputs that parse into ``schema`` (a pydantic model or a JSON schema dict), by a JSON schema
        ``response_format`` (``method="json_schema"``) or a forced call of a tool with that schema
        (``method="function_calling"``); ``json_mode`` asks for any JSON object."""
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        parser: Runnable[Any, Any]
        if method == "function_calling":
            llm = self.bind_tools([schema], tool_choice=name)
            parser = (PydanticToolsParser(tools=[schema], first_tool_only=True) if is_model
                      else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
        elif method in ("json_schema", "json_mode"):
            fmt: dict[str, Any] = {"type": "json_object"}
            if method == "json_schema":
                json_schema = schema.model_json_schema() if is_model else tool["function"]["parameters"]
                fmt = {"type": "json_schema",
                       "json_schema": {"name": name, "schema": json_schema, "strict": True}}
            llm = self.bind(response_format=fmt)
            parser = PydanticOutputParser(pydantic_object=schema) if is_model else JsonOutputParser()
        else:
            raise ValueError(f"method must be json_schema, function_calling or json_mode, got {method!r}")
        if not include_raw:
            return llm | parser
        return RunnableMap(raw=llm) | RunnablePassthrough.assign(
            parsed=lambda x: parser.invoke(x["raw"]), parsing_error=lambda _: None)

    def _result(self, client: Client, result: Result) -> ChatResult:
        if result.tool_calls:
            calls = [{"id": c["id"], "name": c["function"]["name"],
                      "args": json.loads(c["function"]["arguments"]), "type": "tool_call"}
                     for c in result.tool_calls]
            message = AIMessage(content=result.text, tool_calls=calls,
                                usage_metadata=_usage_metadata(result.usage))
            info = _info(client, result.finish_reason, result.usage, result.speculation)
            return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)])
        message = AIMessage(content=result.text, usage_metadata=_usage_metadata(result.usage))
        info = _info(client, result.finish_reason, result.usage, result.speculation)
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)])

    def _chunk(self, client: Client, delta: Delta) -> ChatGenerationChunk:
        if delta.finish_reason is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=delta.text))
        message = AIMessageChunk(content=delta.text, usage_metadata=_usage_metadata(delta.usage),
                                 chunk_position="last")
        info = _info(client, delta.finish_reason, delta.usage, delta.speculation)
        return ChatGenerationChunk(message=message, generation_info=info)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        request = self._options(kwargs).request(stop, messages=_message_dicts(messages))
        client = self.get_client()
        return self._result(client, client.complete(request))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        request = self._options(kwargs).request(stop, messages=_message_dicts(messages))
        client = await self._aget_client()
        return self._result(client, await client.acomplete(request))

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        request = self._options(kwargs).request(stop, messages=_message_dicts(messages))
        client = self.get_client()
        for delta in client.stream(request):
            chunk = self._chunk(client, delta)
            if run_manager is not None:
                run_manager.on_llm_new_token(delta.text, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        request = self._options(kwargs).request(stop, messages=_message_dicts(messages))
        client = await self._aget_client()
        async for delta in client.astream(request):
            chunk = self._chunk(client, delta)
            if run_manager is not None:
                await run_manager.on_llm_new_token(delta.text, chunk=chunk)
            yield chunk
