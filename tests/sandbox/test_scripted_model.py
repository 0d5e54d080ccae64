"""The scripted model, driven through the official openai SDK over real HTTP: both endpoints, both
modes, turns chosen from the history the client sends."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from reconcile.mechanisms.openai.sandbox import OpenAIStandin
from reconcile.mechanisms.openai.sandbox_model import HostedMcpCall, Script, ToolCall, Turn
from stopdrill.sandbox.server import BackgroundServer

Standin = tuple[OpenAIStandin, BackgroundServer]

TWO_TOOLS = Script.build(
    "two-tools",
    [
        Turn(
            tool_calls=(ToolCall("lookup", {"q": "acme"}), ToolCall("create_lead", {"name": "Acme"})),
            mcp_calls=(HostedMcpCall("crm", "search", {"q": "acme"}, status="completed", output="1 hit"),),
        ),
        Turn(text="Created the lead for Acme."),
    ],
)


def sdk(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="no-key-needed", max_retries=0, timeout=5.0)


def test_responses_first_turn_asks_for_the_tools_and_reports_the_hosted_call(openai_standin: Standin) -> None:
    party, server = openai_standin
    model = party.load_script(TWO_TOOLS)

    first = sdk(server).responses.create(model=model, input="Add Acme as a lead")

    kinds = [item.type for item in first.output]
    assert kinds == ["mcp_call", "function_call", "function_call"]
    calls = [i for i in first.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments), c.call_id) for c in calls] == [
        ("lookup", {"q": "acme"}, "call_0_0"),
        ("create_lead", {"name": "Acme"}, "call_0_1"),
    ]
    hosted = first.output[0]
    assert (hosted.server_label, hosted.name, hosted.status, hosted.output) == ("crm", "search", "completed", "1 hit")


def test_responses_answer_the_next_turn_once_the_history_carries_the_call_results(openai_standin: Standin) -> None:
    party, server = openai_standin
    model = party.load_script(TWO_TOOLS)
    history = [
        {"role": "user", "content": "Add Acme as a lead"},
        {"type": "function_call", "call_id": "call_0_0", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0_0", "output": "found"},
    ]

    final = sdk(server).responses.create(model=model, input=history)  # type: ignore[arg-type]
    again = sdk(server).responses.create(model=model, input=history)  # type: ignore[arg-type]

    assert final.output_text == "Created the lead for Acme."
    assert again.output_text == final.output_text  # deterministic: a retry gets the same turn
    assert [e["turn"] for e in party.model_log()] == [1, 1]


def test_streamed_responses_end_with_completed_and_carry_the_same_items(openai_standin: Standin) -> None:
    party, server = openai_standin
    model = party.load_script(TWO_TOOLS)

    events = list(sdk(server).responses.create(model=model, input="Add Acme", stream=True))

    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert types.count("response.output_item.done") == 3
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert [i.type for i in final.output] == ["mcp_call", "function_call", "function_call"]
    assert party.model_log() == [{"endpoint": "responses", "script": "two-tools", "turn": 0, "stream": True}]


def test_chat_completions_turns_and_streamed_tool_call_deltas(openai_standin: Standin) -> None:
    party, server = openai_standin
    model = party.load_script(TWO_TOOLS)
    client = sdk(server)
    messages: list[dict[str, object]] = [{"role": "user", "content": "Add Acme"}]

    first = client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
    streamed = list(
        client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    choice = first.choices[0]
    messages += [
        choice.message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in choice.message.tool_calls or []),
    ]
    last = client.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]

    assert choice.finish_reason == "tool_calls"
    assert [c.id for c in choice.message.tool_calls or []] == ["call_0_0", "call_0_1"]
    ids = [tc.id for ch in streamed if ch.choices for tc in ch.choices[0].delta.tool_calls or [] if tc.id]
    assert ids == ["call_0_0", "call_0_1"]
    assert streamed[-1].usage is not None and streamed[-1].usage.total_tokens == 20
    assert [ch.choices[0].finish_reason for ch in streamed if ch.choices][-1] == "tool_calls"
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].message.content == "Created the lead for Acme."


def test_background_scripted_response_keeps_its_hosted_calls_after_a_cancel(openai_standin: Standin) -> None:
    party, server = openai_standin
    script = Script.build(
        "hosted",
        [Turn(mcp_calls=(HostedMcpCall("crm", "create_record", {"name": "Acme"}, status="calling"),), text="done")],
    )
    client = sdk(server)
    created = client.responses.create(model=party.load_script(script), input="Go", background=True)
    time.sleep(0.05)

    cancelled = client.responses.cancel(created.id)
    read_back = client.responses.retrieve(created.id)

    assert cancelled.status == "cancelled"
    assert [(i.type, i.name, i.status) for i in read_back.output] == [("mcp_call", "create_record", "calling")]  # type: ignore[union-attr]


def test_an_unknown_script_is_a_404_naming_the_model_and_a_bad_script_a_400(openai_standin: Standin) -> None:
    _party, server = openai_standin
    with pytest.raises(openai.NotFoundError, match="script:nope"):
        sdk(server).responses.create(model="script:nope", input="hi")
    bad = httpx.post(server.url + "/_control/scripts", json={"name": "x", "turns": []})
    good = httpx.post(
        server.url + "/_control/scripts",
        json={"name": "http", "turns": [{"tool_calls": [{"name": "t", "arguments": {}}]}, {"text": "ok"}]},
    )

    assert bad.status_code == 400 and "at least one turn" in bad.json()["error"]
    assert good.json() == {"model": "script:http"}
    with pytest.raises(ValueError, match="status"):
        Script.build("s", [Turn(mcp_calls=(HostedMcpCall("a", "b", status="weird"),))])


# --- Anthropic's Messages API (what the Claude Code CLI calls) ---------------------------------


def _sse_events(text: str) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]


def test_messages_answers_the_turn_as_tool_use_blocks_then_text(openai_standin: Standin) -> None:
    party, server = openai_standin
    model = party.load_script(TWO_TOOLS)
    url = server.url + "/v1/messages"
    ask = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "Add Acme"}]}

    first = httpx.post(url, json=ask, timeout=5).json()
    assert first["stop_reason"] == "tool_use"
    assert [(b["type"], b["name"], b["input"], b["id"]) for b in first["content"]] == [
        ("tool_use", "lookup", {"q": "acme"}, "call_0_0"),
        ("tool_use", "create_lead", {"name": "Acme"}, "call_0_1"),
    ]
    results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "ok"} for b in first["content"]]
    history = [
        *ask["messages"],
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": results},
    ]

    streamed = httpx.post(url, json={**ask, "messages": history, "stream": True}, timeout=5)
    events = _sse_events(streamed.text)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,  # "Created the lead for Acme." in pieces of eight
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Created the lead for Acme."
    assert events[-2]["delta"]["stop_reason"] == "end_turn"
    assert [(e["endpoint"], e["turn"], e["stream"]) for e in party.model_log()] == [
        ("messages", 0, False),
        ("messages", 1, True),
    ]


def test_messages_follows_the_script_a_subagent_prompt_names(openai_standin: Standin) -> None:
    party, server = openai_standin
    party.load_script(Script.build("sub", [Turn(text="the subagent's answer")]))
    ask = {
        "model": "claude-sonnet-4-5",  # a subagent inherits its parent's model; its prompt names the script
        "max_tokens": 100,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "[script:sub] survey the logs"}]}],
    }

    answer = httpx.post(server.url + "/v1/messages", json=ask, timeout=5)

    assert answer.json()["content"] == [{"type": "text", "text": "the subagent's answer"}]


def test_messages_refuses_a_request_without_messages_or_an_unknown_model(openai_standin: Standin) -> None:
    _party, server = openai_standin
    url = server.url + "/v1/messages"

    missing = httpx.post(url, json={"model": "script:two-tools"}, timeout=5)
    unknown = httpx.post(url, json={"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}, timeout=5)

    assert missing.status_code == 400 and missing.json()["error"]["type"] == "invalid_request_error"
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
