"""A scripted model behind the OpenAI stand-in, so a real agent framework runs its real tool loop.

A script is a list of turns. Each model request a framework makes is answered with one turn:
function calls it must run (with their arguments), hosted `mcp_call` items the "provider" ran
itself (with their status), and/or final text. It is deterministic and keyless:

- the request's `model` names the script (`"script:two-tools"`), so concurrent runs with different
  scripts share one server;
- the turn is chosen from the request alone: frameworks keep no server-side state and resend the
  whole history (none of them sends `previous_response_id` or `store`), so the next turn is one
  past the last turn whose call ids appear in that history. A retried request gets the same
  answer.

Both endpoints the frameworks call are served, streaming and not: Responses (`POST /v1/responses`,
the Agents SDK's default) and Chat Completions (`POST /v1/chat/completions`, LangChain's and
pydantic-ai's default). The wire shapes follow the openai 3.57 SDK's types.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SCRIPT_PREFIX = "script:"
MCP_STATUSES = frozenset({"in_progress", "completed", "incomplete", "calling", "failed"})
HOSTED_KINDS = frozenset({"mcp_call", "web_search_call"})


@dataclass(frozen=True)
class ToolCall:
    """A function call the application must run; `call_id` is the framework's join key."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""


@dataclass(frozen=True)
class HostedMcpCall:
    """A remote MCP tool the provider ran while the response was active (an `mcp_call` item), or
    a web search (`kind="web_search_call"`, its query in `arguments["q"]`).

    A background response shows it with `status` while it runs or once cancelled, and with
    `final_status` (default: the same) once the response has completed, a cancelled one that
    flipped included. Its `error` shows once its status says it has ended. A `late` call is absent
    until then: the run launched it after the cancel."""

    server_label: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    status: str = "completed"
    output: str | None = None
    error: str | None = None
    call_id: str = ""
    kind: str = "mcp_call"
    final_status: str = ""
    late: bool = False


@dataclass(frozen=True)
class Turn:
    tool_calls: tuple[ToolCall, ...] = ()
    mcp_calls: tuple[HostedMcpCall, ...] = ()
    text: str = ""
    delay_s: float = 0.0  # how long the "model" thinks before answering


@dataclass(frozen=True)
class Script:
    name: str
    turns: tuple[Turn, ...]

    @classmethod
    def build(cls, name: str, turns: list[Turn]) -> Script:
        """Give every call without an id a stable one (`call_<k>_<j>`), unique within the script."""
        if not turns:
            raise ValueError("a script needs at least one turn")
        fixed = []
        for k, turn in enumerate(turns):
            calls = tuple(
                c if c.call_id else ToolCall(c.name, c.arguments, f"call_{k}_{j}")
                for j, c in enumerate(turn.tool_calls)
            )
            for m in turn.mcp_calls:
                for status in filter(None, (m.status, m.final_status)):
                    if status not in MCP_STATUSES:
                        raise ValueError(f"mcp_call status {status!r} is not one of {sorted(MCP_STATUSES)}")
                if m.kind not in HOSTED_KINDS:
                    raise ValueError(f"hosted call kind {m.kind!r} is not one of {sorted(HOSTED_KINDS)}")
            mcps = tuple(
                m if m.call_id else dataclasses.replace(m, call_id=f"mcp_{k}_{j}") for j, m in enumerate(turn.mcp_calls)
            )
            fixed.append(Turn(calls, mcps, turn.text, turn.delay_s))
        return cls(name, tuple(fixed))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Script:
        """The HTTP control form: `{"name": ..., "turns": [{"tool_calls": [{"name", "arguments"}], ...}]}`."""
        turns = []
        for t in data["turns"]:
            turns.append(
                Turn(
                    tool_calls=tuple(ToolCall(**c) for c in t.get("tool_calls", ())),
                    mcp_calls=tuple(HostedMcpCall(**m) for m in t.get("mcp_calls", ())),
                    text=str(t.get("text", "")),
                    delay_s=float(t.get("delay_s", 0.0)),
                )
            )
        return cls.build(str(data["name"]), turns)

    def turn_for(self, history: Any) -> tuple[int, Turn]:
        """The turn that answers a request whose history is `history` (any JSON)."""
        text = json.dumps(history)
        answered = -1
        for k, turn in enumerate(self.turns):
            ids = [c.call_id for c in turn.tool_calls] + [m.call_id for m in turn.mcp_calls]
            if any(f'"{i}"' in text for i in ids):
                answered = k
        index = min(answered + 1, len(self.turns) - 1)
        return index, self.turns[index]


def script_name(model: str) -> str | None:
    return model.removeprefix(SCRIPT_PREFIX) if model.startswith(SCRIPT_PREFIX) else None


# --- Responses API ---------------------------------------------------------------------------


def responses_output(turn: Turn, *, response_id: str) -> list[dict[str, Any]]:
    """The output items of a Responses answer, in the order a real model emits them."""
    items = launched_items(turn, completed=True)
    if turn.text or not items:
        items.append(message_item(response_id, turn.text))
    return items


def launched_items(turn: Turn, *, completed: bool) -> list[dict[str, Any]]:
    """The tool-call items of `turn`: as a background response shows them while it runs or once
    cancelled, or once it has `completed` (late calls present, each at its final status)."""
    hosted = [m for m in turn.mcp_calls if completed or not m.late]
    items: list[dict[str, Any]] = [
        hosted_item(dataclasses.replace(m, status=m.final_status or m.status) if completed else m) for m in hosted
    ]
    for call in turn.tool_calls:
        items.append(
            {
                "id": f"fc_{call.call_id}",
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": json.dumps(call.arguments),
                "status": "completed",
            }
        )
    return items


def hosted_item(m: HostedMcpCall) -> dict[str, Any]:
    if m.kind == "web_search_call":
        query = str(m.arguments.get("q", ""))
        return {
            "id": m.call_id,
            "type": "web_search_call",
            "status": m.status,
            "action": {"type": "search", "query": query},
        }
    return mcp_call_item(m)


def mcp_call_item(m: HostedMcpCall) -> dict[str, Any]:
    # An MCP tool's error is its result's content: a list of content blocks. A call still running
    # has no result yet, so its error shows only once it has ended.
    running = m.status in ("calling", "in_progress")
    error = (
        {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": m.error}]}
        if m.error and not running
        else None
    )
    return {
        "id": m.call_id,
        "type": "mcp_call",
        "server_label": m.server_label,
        "name": m.name,
        "arguments": json.dumps(m.arguments),
        "status": m.status,
        "output": m.output,
        "error": error,
        "approval_request_id": None,
    }


def message_item(response_id: str, text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{response_id.removeprefix('resp_')}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def response_object(
    *, response_id: str, model: str, output: list[dict[str, Any]], status: str, created_at: float
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "background": False,
        "store": False,
        "model": model,
        "output": output,
        "metadata": {},
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "completed_at": time.time() if status == "completed" else None,
        "usage": usage_responses() if status == "completed" else None,
    }


def usage_responses() -> dict[str, Any]:
    return {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 20,
    }


def responses_events(final: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The SSE events of a streamed Responses answer whose final object is `final`."""
    seq = iter(range(1_000_000))
    in_progress = {**final, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
    yield {"type": "response.created", "response": in_progress, "sequence_number": next(seq)}
    yield {"type": "response.in_progress", "response": in_progress, "sequence_number": next(seq)}
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            added = {**item, "status": "in_progress", "content": []}
            yield _item_event("added", added, index, next(seq))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield {
                "type": "response.content_part.added",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": part,
                "sequence_number": next(seq),
            }
            for chunk in _chunks(text):
                yield {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": chunk,
                    "logprobs": [],
                    "sequence_number": next(seq),
                }
            yield {
                "type": "response.output_text.done",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "text": text,
                "logprobs": [],
                "sequence_number": next(seq),
            }
            yield {
                "type": "response.content_part.done",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": {**part, "text": text},
                "sequence_number": next(seq),
            }
        elif item["type"] == "function_call":
            yield _item_event("added", {**item, "arguments": "", "status": "in_progress"}, index, next(seq))
            yield {
                "type": "response.function_call_arguments.delta",
                "item_id": item["id"],
                "output_index": index,
                "delta": item["arguments"],
                "sequence_number": next(seq),
            }
            yield {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": index,
                "arguments": item["arguments"],
                "name": item["name"],
                "sequence_number": next(seq),
            }
        else:
            yield _item_event("added", item, index, next(seq))
        yield _item_event("done", item, index, next(seq))
    yield {"type": "response.completed", "response": final, "sequence_number": next(seq)}


def _item_event(what: str, item: dict[str, Any], index: int, seq: int) -> dict[str, Any]:
    return {"type": f"response.output_item.{what}", "item": item, "output_index": index, "sequence_number": seq}


# --- Chat Completions ------------------------------------------------------------------------


def chat_completion(turn: Turn, *, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None, "refusal": None}
    if turn.tool_calls:
        message["tool_calls"] = [_chat_tool_call(c) for c in turn.tool_calls]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
    }


def chat_chunks(turn: Turn, *, model: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in _chunks(turn.text) if turn.text else ():
        yield chunk({"content": piece})
    for index, call in enumerate(turn.tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
        )
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": json.dumps(call.arguments)}}]})
    yield chunk({}, "tool_calls" if turn.tool_calls else "stop")
    if include_usage:
        yield {**base, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}}


def _chat_tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def _chunks(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# --- Anthropic Messages ----------------------------------------------------------------------
# The same scripts over Anthropic's Messages wire (`POST /v1/messages`), which the Claude Code CLI
# speaks (the Claude Agent SDK drives it, with ANTHROPIC_BASE_URL naming this server). A subagent
# the CLI starts inherits the model, so a conversation whose first user message names a script
# (`[script:<name>]`, e.g. in a Task's prompt) follows that script instead.

SCRIPT_MARKER = re.compile(r"\[script:([A-Za-z0-9_.-]+)\]")


def messages_script_name(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
    found = SCRIPT_MARKER.search(json.dumps(first)) if first is not None else None
    return found.group(1) if found else script_name(str(body.get("model", "")))


def messages_content(turn: Turn) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text or not turn.tool_calls else []
    content += [{"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.arguments} for c in turn.tool_calls]
    return content


def messages_answer(turn: Turn, *, model: str) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": messages_content(turn),
        "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 8},
    }


def messages_events(answer: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The SSE events of a streamed Messages answer: message_start, each content block (started
    empty, then its delta: text, or the tool input's JSON), message_delta with the stop reason,
    message_stop."""
    start = {**answer, "content": [], "stop_reason": None, "usage": {"input_tokens": 12, "output_tokens": 1}}
    yield {"type": "message_start", "message": start}
    for index, block in enumerate(answer["content"]):
        if block["type"] == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            for piece in _chunks(block["text"]):
                yield {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
        else:
            yield {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            partial = json.dumps(block["input"])
            yield {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": partial},
            }
        yield {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": answer["stop_reason"], "stop_sequence": None}
    yield {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 8}}
    yield {"type": "message_stop"}


def claude_cli_env(base_url: str, home: str) -> dict[str, str]:
    """The environment that points the Claude Code CLI at this stand-in (`base_url`, without
    `/v1`) and at nothing else: a throwaway key, no telemetry, error reports, update checks or other
    traffic, a HOME of its own, and any other host sent to a proxy that is not there."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-stand-in-not-a-key",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "HOME": home,
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
    }
