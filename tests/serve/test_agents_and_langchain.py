"""The libraries apps are built with, against a real `llm-onnx serve`: OpenAI's Agents SDK runs
an agent with a function tool over the Responses API (its default) and over Chat Completions;
LangChain's ChatOpenAI gives a structured object (`with_structured_output`) and tool calls
(`bind_tools`). The tiny byte-level model writes anything the constraint allows; what is checked
is the protocol: the tool is called with arguments valid under its schema, its result goes
back, the run ends with an answer."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from tests.byte_model import HERMES_TEMPLATE
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes"


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=150)


@pytest.fixture(scope="module")
def server(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--max-batch", "2", "--chat-template",
                         str(HERMES_TEMPLATE))
    yield proc
    proc.stop()


def _agent(server, api: str):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)
    cities: list[str] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather in a city."""
        cities.append(city)
        # Once the weather is known, the agent answers (a random model left to "auto" may
        # call the tool again and again): its next turn may not call tools.
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")
        return "12 degrees and rain"

    model = (OpenAIResponsesModel(model=NAME, openai_client=client) if api == "responses"
             else OpenAIChatCompletionsModel(model=NAME, openai_client=client))
    # The answer is a typed object (output_type: a JSON schema the reply is held to), so the
    # random model's final turn ends where the schema does rather than at max_tokens.
    agent = Agent(name="forecaster", instructions="Answer with the weather.", tools=[get_weather],
                  model=model, output_type=Person, reset_tool_choice=False,
                  model_settings=ModelSettings(
                      tool_choice="required", parallel_tool_calls=False, temperature=0,
                      max_tokens=200))
    return agent, cities


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_agent_calls_its_function_tool_and_answers(server, api):
    from agents import Runner

    agent, cities = _agent(server, api)
    # In a thread of its own: run_sync refuses a thread whose event loop is running, and the
    # session's Playwright browser (tests/serve/browser.py) keeps one running in the main thread
    # once a browser test has run in this process.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result = pool.submit(Runner.run_sync, agent, "What is the weather in Oslo?",
                             max_turns=4).result()
    assert len(cities) >= 1 and all(isinstance(c, str) and len(c) <= 12 for c in cities)
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert kinds[-1] == "message_output_item" and isinstance(result.final_output, Person)


def test_langchain_structured_output_and_bound_tools(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=NAME, base_url=server.url + "/v1", api_key="unused", temperature=0,
                     max_tokens=200, max_retries=0, timeout=120)
    person = llm.with_structured_output(Person).invoke("Describe a person.")
    assert isinstance(person, Person)

    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather in a city."""
        return "12 degrees"

    reply = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Oslo?")
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "get_weather"
    assert isinstance(reply.tool_calls[0]["args"]["city"], str)
