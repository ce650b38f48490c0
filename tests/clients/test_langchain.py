"""The LangChain wrapper (lookupspec.integrations.langchain) driven by the real langchain-core: LLM and chat
model, in-process and against a real gateway subprocess. Both serve the same tiny model greedily, so the
text is gibberish but deterministic, and the two backends must agree token for token."""

from __future__ import annotations

import asyncio
import functools
import importlib
import operator
import sys
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, ChatMessage, FunctionMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import LLMResult
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from pydantic import ValidationError

import lookupspec.integrations.langchain as lc
from lookupspec.client import ClientError, GenerationRequest, LocalClient
from lookupspec.integrations.langchain import ChatLookupspec, LookupspecLLM
from lookupspec.stats import SPECULATION_KEYS

PROMPT = "The history of the lighthouse"
CHAT = [SystemMessage("You are terse."), HumanMessage("Name three rivers.")]


class Recorder(BaseCallbackHandler):
    """Records what LangChain hands the callbacks: every new token, and the final result."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.results: list[LLMResult] = []

    def on_llm_new_token(self, token: Any, **kwargs: Any) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        self.results.append(response)


@pytest.fixture(scope="module", params=["local", "gateway"])
def backend(request, local_client, tiny_gateway):
    """(name, LookupspecLLM, ChatLookupspec) on one backend: the shared in-process client passed in, or
    the gateway by URL (its client created lazily by the models)."""
    if request.param == "local":
        yield "local", LookupspecLLM(client=local_client, temperature=0, max_tokens=16), \
            ChatLookupspec(client=local_client, temperature=0, max_tokens=16)
        return
    llm = LookupspecLLM(base_url=tiny_gateway.url, temperature=0, max_tokens=16)
    chat = ChatLookupspec(base_url=tiny_gateway.url, temperature=0, api_key="sk-unused", max_tokens=16)
    yield "gateway", llm, chat
    llm.close()
    chat.close()


@pytest.fixture
def llm(backend) -> LookupspecLLM:
    return backend[1]


@pytest.fixture
def chat(backend) -> ChatLookupspec:
    return backend[2]


def test_llm_stream_concatenates_to_invoke_and_calls_back_per_chunk(llm) -> None:
    text = llm.invoke(PROMPT)
    recorder = Recorder()
    chunks = list(llm.stream(PROMPT, config={"callbacks": [recorder]}))
    assert text and "".join(chunks) == text and len(chunks) > 1
    assert recorder.tokens == chunks
    streamed = recorder.results[0].generations[0][0]
    assert streamed.text == text and streamed.generation_info is not None
    assert streamed.generation_info["usage"]["completion_tokens"] == 16

    generation = llm.generate([PROMPT]).generations[0][0]
    info = generation.generation_info
    assert generation.text == text and info is not None
    assert info["finish_reason"] == "length" and info["model_name"] == llm.get_client().model
    assert info["usage"]["completion_tokens"] == 16 and info["usage"] == streamed.generation_info["usage"]
    assert set(info["speculation"]) == set(SPECULATION_KEYS) and info["speculation"]["steps"] >= 1


def test_chat_stream_concatenates_to_invoke_with_metadata_on_the_last_chunk(chat) -> None:
    message = chat.invoke(CHAT)
    recorder = Recorder()
    chunks = list(chat.stream(CHAT, config={"callbacks": [recorder]}))
    assert message.content and "".join(str(c.content) for c in chunks) == message.content
    assert recorder.tokens == [c.content for c in chunks]
    assert message.usage_metadata is not None and message.usage_metadata["output_tokens"] == 16
    merged = functools.reduce(operator.add, chunks)
    assert merged.usage_metadata == message.usage_metadata
    last = chunks[-1].response_metadata
    assert last["finish_reason"] == message.response_metadata["finish_reason"] == "length"
    assert last["model_name"] == message.response_metadata["model_name"] == chat.get_client().model
    for meta in (last, message.response_metadata):
        assert set(meta["speculation"]) == set(SPECULATION_KEYS) and meta["speculation"]["steps"] >= 1
        assert meta["usage"]["completion_tokens"] == 16


def test_batch_and_async_variants_match_invoke(llm, chat) -> None:
    prompts = ["The river", "A small town by the sea"]
    expected = [llm.invoke(p) for p in prompts]
    assert llm.batch(prompts) == expected
    reply = chat.invoke(CHAT).content
    assert [m.content for m in chat.batch([CHAT, CHAT])] == [reply, reply]

    async def run() -> tuple[Any, ...]:
        recorder = Recorder()
        return (await llm.ainvoke(prompts[0]),
                [c async for c in llm.astream(prompts[1], config={"callbacks": [recorder]})],
                await llm.abatch(prompts), recorder.tokens,
                await chat.ainvoke(CHAT), [c async for c in chat.astream(CHAT)])

    one, parts, many, tokens, message, chunks = asyncio.run(run())
    assert one == expected[0] and "".join(parts) == expected[1] and many == expected and tokens == parts
    assert message.content == reply and "".join(str(c.content) for c in chunks) == reply
    assert chunks[-1].usage_metadata == message.usage_metadata
    assert set(chunks[-1].response_metadata["speculation"]) == set(SPECULATION_KEYS)


def test_prompt_llm_parser_chains(llm, chat) -> None:
    chain = PromptTemplate.from_template("Facts about {topic}:") | llm | StrOutputParser()
    text = llm.invoke("Facts about owls:")
    assert chain.invoke({"topic": "owls"}) == text
    assert "".join(chain.stream({"topic": "owls"})) == text

    template = ChatPromptTemplate.from_messages([("system", "You are terse."), ("human", "{question}")])
    chat_chain = template | chat | StrOutputParser()
    assert chat_chain.invoke({"question": "Name three rivers."}) == chat.invoke(CHAT).content


def test_messages_reach_the_model_as_role_content_pairs(chat) -> None:
    history = [SystemMessage("Be brief."), HumanMessage([{"type": "text", "text": "Hi"}, " there"]),
               AIMessage("Hello."), ChatMessage(role="user", content="Name a colour.")]
    direct = chat.get_client().complete(GenerationRequest(temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}],
        max_tokens=16))
    assert chat.invoke(history).content == direct.text


def test_stop_strings_cut_the_text(llm, chat) -> None:
    full = llm.invoke("Counting:", max_tokens=24)
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert stop.strip(), "the tiny model's text should have non-space characters mid-way"
    cut = llm.generate(["Counting:"], stop=[stop], max_tokens=24).generations[0][0]
    assert cut.text == full[:full.index(stop)] and cut.generation_info is not None
    assert cut.generation_info["finish_reason"] == "stop"
    assert "".join(llm.stream("Counting:", stop=[stop], max_tokens=24)) == cut.text

    whole = str(chat.invoke(CHAT, max_tokens=24).content)
    chat_stop = whole[len(whole) // 2: len(whole) // 2 + 2]
    assert chat_stop.strip()
    message = chat.invoke(CHAT, stop=[chat_stop], max_tokens=24)
    assert message.content == whole[:whole.index(chat_stop)]
    assert message.response_metadata["finish_reason"] == "stop"


def test_collections_and_inline_documents_are_drafted_from(backend) -> None:
    name, llm, chat = backend
    prompt = f"Notes on the {name} backend: the archive says"
    first = llm.generate([prompt], max_tokens=32, speculation=False).generations[0][0]
    assert first.generation_info is not None and first.generation_info["speculation"]["draft_tokens"] == 0
    copy = prompt + first.text  # a document holding the continuation: corpus drafts must be accepted
    collection = f"lc-notes-{name}"
    assert llm.get_client().add_documents(collection, [{"id": "n1", "text": copy}]) == 1
    for lookup in ({"collections": [collection]}, {"documents": [copy]}):
        again = llm.generate([prompt], max_tokens=32, sources=["corpus"], **lookup).generations[0][0]
        assert again.text == first.text and again.generation_info is not None
        assert again.generation_info["speculation"]["accepted_tokens_by_source"].get("corpus", 0) > 0, lookup

    answer = chat.invoke(CHAT, max_tokens=32, speculation=False)
    assert chat.get_client().add_documents(f"{collection}-chat", [{"id": "a", "text": answer.content}]) == 1
    bound = chat.bind(collections=[f"{collection}-chat"], sources=["corpus"], max_tokens=32)
    again_message = bound.invoke(CHAT)
    assert again_message.content == answer.content
    assert again_message.response_metadata["speculation"]["accepted_tokens_by_source"].get("corpus", 0) > 0


def test_an_unknown_collection_is_an_error_naming_it(llm, chat) -> None:
    with pytest.raises(ClientError, match="no-such-collection") as err:
        llm.invoke(PROMPT, collections=["no-such-collection"])
    assert err.value.status == 404 and err.value.param == "lookup.collections[0]"
    with pytest.raises(ClientError, match="missing-too"):
        list(chat.stream(CHAT, collections=["missing-too"]))

    async def astream() -> list[Any]:
        return [c async for c in chat.astream(CHAT, collections=["missing-async"])]

    with pytest.raises(ClientError, match="missing-async"):
        asyncio.run(astream())


def test_in_process_and_gateway_give_the_same_result(local_client, tiny_gateway) -> None:
    here_llm = LookupspecLLM(client=local_client, temperature=0)
    there_llm = LookupspecLLM(base_url=tiny_gateway.url, temperature=0)
    here_chat = ChatLookupspec(client=local_client, temperature=0)
    there_chat = ChatLookupspec(base_url=tiny_gateway.url, temperature=0)
    try:
        here = here_llm.generate([PROMPT], max_tokens=24).generations[0][0]
        there = there_llm.generate([PROMPT], max_tokens=24).generations[0][0]
        assert here.text == there.text and here.text
        assert here.generation_info is not None and there.generation_info is not None
        assert here.generation_info["usage"] == there.generation_info["usage"]
        here_message = here_chat.invoke(CHAT, max_tokens=24)
        there_message = there_chat.invoke(CHAT, max_tokens=24)
        assert here_message.content == there_message.content and here_message.content
        assert here_message.usage_metadata == there_message.usage_metadata
    finally:
        there_llm.close()
        there_chat.close()


def test_the_in_process_client_is_created_once_on_first_use(tiny_model, monkeypatch) -> None:
    calls: list[Any] = []

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_connect(*args, **kwargs)

    real_connect = lc.connect
    monkeypatch.setattr(lc, "connect", counting_connect)
    llm = LookupspecLLM(model=str(tiny_model), temperature=0, max_tokens=4)
    chat = ChatLookupspec(model=str(tiny_model), temperature=0, max_tokens=4)
    assert calls == []
    # Runnable.batch runs the chat model on a thread pool: the first calls race to create the client.
    replies = chat.batch(["One", "Two", "Three"], config={"max_concurrency": 3})
    assert len(calls) == 1 and [m.content for m in replies] == [chat.invoke(p).content for p in
                                                                ("One", "Two", "Three")]
    assert llm.batch(["One", "Two"]) == [llm.invoke("One"), llm.invoke("Two")]
    client = llm.get_client()
    assert isinstance(client, LocalClient) and client.model == str(tiny_model) and len(calls) == 2
    assert asyncio.run(llm.ainvoke("One")) == llm.invoke("One") and len(calls) == 2


def test_options_are_validated_before_any_model_loads() -> None:
    llm = LookupspecLLM(model="never-loaded", api_key="sk-secret-key")
    chat = ChatLookupspec(model="never-loaded")
    with pytest.raises(TypeError, match="temprature"):
        llm.invoke("x", temprature=0.5)
    with pytest.raises(TypeError, match="tool_chioce"):
        chat.invoke("x", tool_chioce="auto")
    with pytest.raises(ValidationError, match="max_tokens"):
        llm.invoke("x", max_tokens=0)
    with pytest.raises(ValueError, match="FunctionMessage"):
        chat.invoke([FunctionMessage("result", name="f")])
    with pytest.raises(ValueError, match="image"):
        chat.invoke([HumanMessage([{"type": "image", "url": "http://example.invalid/x.png"}])])
    with pytest.raises(ValidationError, match="base_url"):
        ChatLookupspec()
    with pytest.raises(ValidationError, match="http"):
        LookupspecLLM(base_url="localhost:8000")
    with pytest.raises(ValidationError, match="max_token"):
        LookupspecLLM(model="m", max_token=5)
    assert "sk-secret-key" not in repr(llm) and "sk-secret-key" not in str(llm.model_dump())
    assert "client" not in LookupspecLLM(client=LocalClient(object())).model_dump()
    assert llm._identifying_params["model"] == "never-loaded" and llm._llm_type == "lookupspec"


def test_a_missing_langchain_core_names_the_extra_to_install(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "langchain_core" or m.startswith("langchain_core.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "lookupspec.integrations.langchain")
    with pytest.raises(ImportError, match=r"pip install 'lookupspec\[langchain\]'"):
        importlib.import_module("lookupspec.integrations.langchain")


@pytest.mark.real_model
def test_real_model_chat_chain_answers_from_a_document(real_model_dir) -> None:
    chat = ChatLookupspec(model=str(real_model_dir), temperature=0, max_tokens=32)
    template = ChatPromptTemplate.from_messages([("system", "Answer in one short sentence."),
                                                 ("human", "{question}")])
    document = "The capital of France is Paris. Paris is known for the Eiffel Tower."
    chain = template | chat.bind(documents=[document])
    message = chain.invoke({"question": "What is the capital of France?"})
    assert "Paris" in message.content
    speculation = message.response_metadata["speculation"]
    assert speculation["steps"] >= 1 and speculation["accepted_tokens"] > 0
    assert speculation["acceptance_length"] > 1 and speculation["draft_tokens_by_source"].get("corpus", 0) > 0
    plain = (template | chat.bind(speculation=False) | StrOutputParser()).invoke(
        {"question": "What is the capital of France?"})
    assert plain == message.content  # speculation never changes the output
