"""An OpenAI Responses API stand-in: background create, retrieve, cancel, and their races.

Follows the documented wire protocol (OpenAI's background mode guide) closely enough that the
official `openai` SDK parses every answer, including the awkward parts:

- a background response is `queued`, then `in_progress`, then final after `run_s`;
- cancel is only for background responses (400 otherwise) and repeating it returns the
  final object; cancelling an already finished one is undocumented upstream, so it is a
  setting: 409 like ogx/Llama Stack (default) or the unchanged object like sglang;
- there is no list endpoint, so a create whose answer was lost leaves an orphan that only
  the `/_control/responses` side channel (for tests, not for the code under test) can see;
- a background response created with `store=false` is kept only about ten minutes after it ends
  (`unstored_retention_s`), then its retrieve answers 404, so a read-back that comes too late finds
  nothing;
- with `webhook_url` and `webhook_secret` configured, each background response that ends sends
  OpenAI's `response.*` webhook there, signed, at least once, sometimes twice, in no particular
  order (`sandbox_hooks.py`); a ticker then moves responses on the clock, read or not;
- a request whose `model` is `script:<name>` is answered by a scripted model
  (`sandbox_model.py`): function calls, hosted `mcp_call` items, then a final answer, over
  Responses and Chat Completions, streamed or not, and over Anthropic's Messages API (for the
  Claude Code CLI). A scripted background response carries its
  turn's hosted tool calls as output items from the moment it runs, so a cancel leaves them there
  for the application to inspect, as upstream does.

Time is evaluated lazily on each read: a response's status is a function of the clock and
of what happened to it, so no background task has to run and a stopped server loses nothing
a test cares about.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from reconcile.mechanisms.openai import sandbox_model as sm
from reconcile.mechanisms.openai.sandbox_hooks import WebhookSender
from stopdrill.sandbox.common import SandboxParty

RUNNING = frozenset({"queued", "in_progress"})
TERMINAL = frozenset({"completed", "failed", "cancelled", "incomplete"})

# Fault names. Each can be global or aimed at one response id.
IGNORE_CANCEL = "ignore_cancel"  # cancel answers 200 with the run still in progress; it completes later
FLIP_TO_COMPLETED = "flip_to_completed"  # cancel answers `cancelled`, a later read shows `completed`
CANCEL_409 = "cancel_409"
CANCEL_500 = "cancel_500"
RETRIEVE_500 = "retrieve_500"
HANG = "hang"  # cancel and retrieve never answer
CREATE_HANG = "create_hang"  # create records and starts the run, but its answer never comes
FAIL = "fail"  # the run ends `failed`
INCOMPLETE = "incomplete"  # the run ends `incomplete` (max_output_tokens)

CancelOnTerminal = Literal["409", "200"]


@dataclass
class StoredResponse:
    id: str
    model: str
    input: Any
    metadata: dict[str, str]
    background: bool
    store: bool
    created_at: float  # wall clock, as the API reports it
    started: float  # monotonic, drives the lazy state machine
    queue_s: float
    run_s: float
    output_text: str
    status: str = "queued"
    completed_at: float | None = None
    error: dict[str, str] | None = None
    incomplete_reason: str | None = None
    cancel_requests: int = 0
    cancel_ignored: bool = False
    flip_at: float | None = None  # monotonic time at which a `cancelled` turns `completed`
    ended_at: float | None = None  # wall clock of its latest terminal status (the provider's final state)
    history: list[str] = field(default_factory=list)
    tool_items: list[dict[str, Any]] = field(default_factory=list)  # tool calls a script launched, while it runs
    tool_items_completed: list[dict[str, Any]] = field(default_factory=list)  # ... and once it has completed

    def to_json(self) -> dict[str, Any]:
        completed = self.status == "completed"
        return {
            "id": self.id,
            "object": "response",
            "created_at": int(self.created_at),
            "status": self.status,
            "background": self.background,
            "store": self.store,
            "model": self.model,
            "output": self._output(completed),
            "metadata": dict(self.metadata),
            "error": self.error,
            "incomplete_details": {"reason": self.incomplete_reason} if self.incomplete_reason else None,
            "instructions": None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "temperature": 1.0,
            "top_p": 1.0,
            "completed_at": self.completed_at,
            "usage": _usage() if completed else None,
        }

    def _output(self, completed: bool) -> list[dict[str, Any]]:
        if completed:
            return [*self.tool_items_completed, _message(self.id, self.output_text)]
        return list(self.tool_items) if self.status != "queued" else []


class OpenAIStandin(SandboxParty):
    """State and behaviour of the stand-in; `app()` builds a fresh Starlette app over it.

    Python control: `configure(...)`, `set_fault(...)`, `arm(fault)` for the next created
    response, `finish(id, status)`, `responses()`, `get(id)`, `stats()`, `reset()`.
    HTTP control: `/_control/{stats,config,faults,reset,responses,arm,finish}`.
    """

    FAULTS: ClassVar[frozenset[str]] = frozenset(
        {IGNORE_CANCEL, FLIP_TO_COMPLETED, CANCEL_409, CANCEL_500, RETRIEVE_500, HANG, CREATE_HANG, FAIL, INCOMPLETE}
    )
    CONFIG_FIELDS: ClassVar[tuple[str, ...]] = (
        "latency_s",
        "queue_s",
        "run_s",
        "flip_after_s",
        "cancel_on_terminal",
        "output_text",
        "webhook_url",
        "webhook_secret",
        "webhook_duplicate_rate",
        "webhook_jitter_s",
        "unstored_retention_s",
    )
    TICK_S = 0.01  # how often, with webhooks on, responses are moved on the clock

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        queue_s: float = 0.05,
        run_s: float = 1.0,
        flip_after_s: float = 0.3,
        cancel_on_terminal: CancelOnTerminal = "409",
        output_text: str = "",
        webhook_url: str = "",
        webhook_secret: str = "",
        webhook_duplicate_rate: float = 0.0,
        webhook_jitter_s: float = 0.0,
        unstored_retention_s: float = 600.0,
    ) -> None:
        super().__init__(latency_s=latency_s)
        self.queue_s = queue_s
        self.run_s = run_s
        self.flip_after_s = flip_after_s
        self.cancel_on_terminal: CancelOnTerminal = cancel_on_terminal
        self.output_text = output_text
        self._responses: dict[str, StoredResponse] = {}
        self._armed: list[set[str]] = []
        self._scripts: dict[str, sm.Script] = {}
        self._model_log: list[dict[str, Any]] = []
        self.webhook_url = webhook_url
        self.webhook_secret = webhook_secret
        self.webhook_duplicate_rate = webhook_duplicate_rate
        self.webhook_jitter_s = webhook_jitter_s
        self.unstored_retention_s = unstored_retention_s
        self._ended: list[tuple[str, str]] = []  # (status, response id) not yet handed to the sender
        self._sender: WebhookSender | None = None
        self._hooks_apply()

    # --- webhooks ---------------------------------------------------------------------

    def configure(self, **changes: Any) -> dict[str, Any]:
        config = super().configure(**changes)
        if any(name.startswith("webhook_") for name in changes):
            self._hooks_apply()
        return config

    def _hooks_apply(self) -> None:
        """(Re)start the sender and its ticker for the configured URL, or stop them."""
        with self.lock:
            old, self._sender = self._sender, None
            if self.webhook_url and self.webhook_secret:
                self._sender = WebhookSender(
                    url=self.webhook_url,
                    secret=self.webhook_secret,
                    duplicate_rate=self.webhook_duplicate_rate,
                    jitter_s=self.webhook_jitter_s,
                )
                threading.Thread(target=self._tick, args=(self._sender,), name="openai-ticker", daemon=True).start()
        if old is not None:
            old.close()

    def _tick(self, sender: WebhookSender) -> None:
        """Move every response on the clock (a run ends whether or not anyone reads it) and hand
        the ones that ended to the sender, until the sender is replaced."""
        while True:
            time.sleep(self.TICK_S)
            with self.lock:
                if self._sender is not sender:
                    return
                for stored in self._responses.values():
                    if stored.status in RUNNING or stored.flip_at is not None:
                        self._advance(stored)
                ended, self._ended = self._ended, []
            for status, response_id in ended:
                sender.event(status, response_id)

    def webhooks_sent(self) -> list[dict[str, Any]]:
        """Every webhook attempt so far: id, type, response, attempt, HTTP status, time."""
        sender = self._sender
        return [dataclasses.asdict(sent) for sent in list(sender.sent)] if sender is not None else []

    # --- Python control API -----------------------------------------------------------

    def arm(self, fault: str, times: int = 1) -> None:
        """Aim `fault` at the next `times` responses created (their ids are not known yet)."""
        self.check_fault(fault)
        with self.lock:
            # One slot per future response; arming twice aims both faults at the same one.
            while len(self._armed) < times:
                self._armed.append(set())
            for slot in self._armed[:times]:
                slot.add(fault)

    def load_script(self, script: sm.Script) -> str:
        """Serve `script`; returns the model name that selects it (`script:<name>`)."""
        with self.lock:
            self._scripts[script.name] = script
        return sm.SCRIPT_PREFIX + script.name

    def model_log(self) -> list[dict[str, Any]]:
        """Every scripted model request answered: endpoint, script, turn, stream (tests read it)."""
        with self.lock:
            return list(self._model_log)

    def get(self, response_id: str) -> dict[str, Any] | None:
        with self.lock:
            stored = self._responses.get(response_id)
            if stored is None:
                return None
            self._advance(stored)
            return stored.to_json()

    def responses(self) -> list[dict[str, Any]]:
        """Every response ever created, orphans included (the real API cannot list them)."""
        with self.lock:
            for stored in self._responses.values():
                self._advance(stored)
            return [s.to_json() for s in self._responses.values()]

    def ended_at(self, response_id: str) -> float | None:
        """When (wall clock) the response last reached a terminal status, or None."""
        with self.lock:
            stored = self._responses.get(response_id)
            if stored is None:
                return None
            self._advance(stored)
            return stored.ended_at

    def flip_now(self) -> int:
        """Every flip still to come (FLIP_TO_COMPLETED) comes now: the next read of each of those
        responses finds it `completed`. How many. For a test that must read a cancelled response
        back before its flip however slow the machine, then after it."""
        with self.lock:
            pending = [stored for stored in self._responses.values() if stored.flip_at is not None]
            for stored in pending:
                stored.flip_at = time.monotonic()
            return len(pending)

    def finish(self, response_id: str, status: str = "completed") -> dict[str, Any]:
        """Force a response to a terminal status now, whatever it was (a late flip, too)."""
        if status not in TERMINAL:
            raise ValueError(f"{status!r} is not a terminal status")
        with self.lock:
            stored = self._responses[response_id]
            self._set_status(stored, status)
            stored.flip_at = None
            return stored.to_json()

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self._responses.clear()
            self._armed.clear()
            self._ended.clear()
            self._model_log.clear()

    # --- state machine ----------------------------------------------------------------

    def _advance(self, stored: StoredResponse) -> None:
        """Bring `stored` up to date with the clock. Caller holds the lock."""
        now = time.monotonic()
        if stored.status in RUNNING:
            elapsed = now - stored.started
            if elapsed >= stored.queue_s + stored.run_s:
                # Dated when the run ended on the clock, not when someone looked.
                ended = time.time() - (elapsed - stored.queue_s - stored.run_s)
                self._set_status(stored, self._outcome(stored), at=ended)
            elif elapsed >= stored.queue_s and stored.status == "queued":
                self._set_status(stored, "in_progress")
        elif stored.status == "cancelled" and stored.flip_at is not None and now >= stored.flip_at:
            # The Azure case: termination was not guaranteed and the output arrived anyway.
            flipped = time.time() - (now - stored.flip_at)
            stored.flip_at = None
            self._set_status(stored, "completed", at=flipped)

    def _outcome(self, stored: StoredResponse) -> str:
        if self._has_fault_locked(FAIL, [stored.id]):
            return "failed"
        if self._has_fault_locked(INCOMPLETE, [stored.id]):
            return "incomplete"
        return "completed"

    def _set_status(self, stored: StoredResponse, status: str, at: float | None = None) -> None:
        stored.status = status
        stored.history.append(status)
        stored.error = None
        stored.incomplete_reason = None
        if status in TERMINAL:
            stored.ended_at = at or time.time()
            stored.completed_at = stored.ended_at if status == "completed" else None
            if stored.background and self._sender is not None:
                self._ended.append((status, stored.id))
        if status == "failed":
            stored.error = {"code": "server_error", "message": "The stand-in was told to fail this run."}
        elif status == "incomplete":
            stored.incomplete_reason = "max_output_tokens"

    # --- HTTP handlers ----------------------------------------------------------------

    async def _create(self, request: Request) -> JSONResponse | StreamingResponse:
        await self.arrive("create")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Request body is not valid JSON.")
        if not isinstance(body, dict) or not body.get("model"):
            return _error(400, "Missing required parameter: 'model'.", param="model")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > 16:
            return _error(400, "metadata must be an object with at most 16 keys.", param="metadata")
        script = self._script_for(body)
        if isinstance(script, JSONResponse):
            return script
        if script is not None and not body.get("background"):
            return await self._scripted_responses(script, body)
        stored = self._store_new(body, metadata, script)
        if self.has_fault(CREATE_HANG, stored.id):
            await self.hang()
        if not stored.background:
            # Foreground: the caller waits for the whole run, as with the real API.
            await anyio.sleep(stored.queue_s + stored.run_s)
        with self.lock:
            self._advance(stored)
            return JSONResponse(stored.to_json())

    def _store_new(self, body: dict[str, Any], metadata: dict[str, Any], script: sm.Script | None) -> StoredResponse:
        with self.lock:
            stored = StoredResponse(
                id=f"resp_{uuid.uuid4().hex}",
                model=str(body["model"]),
                input=body.get("input"),
                metadata={str(k): str(v) for k, v in metadata.items()},
                background=bool(body.get("background", False)),
                store=bool(body.get("store", True)),
                created_at=time.time(),
                started=time.monotonic(),
                queue_s=self.queue_s,
                run_s=self.run_s,
                output_text=self.output_text or f"Stand-in answer to: {_summarise(body.get('input'))}",
                history=["queued"],
            )
            if script is not None:
                index, turn = script.turn_for(body.get("input"))
                stored.tool_items = sm.launched_items(turn, completed=False)
                stored.tool_items_completed = sm.launched_items(turn, completed=True)
                stored.output_text = turn.text or stored.output_text
                self._log("responses", script, index, background=True)
            self._responses[stored.id] = stored
            if self._armed:
                self._targeted_faults.setdefault(stored.id, set()).update(self._armed.pop(0))
        return stored

    async def _retrieve(self, request: Request) -> JSONResponse:
        response_id = request.path_params["response_id"]
        await self.arrive("retrieve", response_id)
        if self.has_fault(HANG, response_id):
            await self.hang()
        if self.has_fault(RETRIEVE_500, response_id):
            return _error(500, "The server had an error while processing your request.", kind="server_error")
        with self.lock:
            stored = self._responses.get(response_id)
            if stored is None or not (stored.store or stored.background):
                return _not_found(response_id)
            self._advance(stored)
            if self._gone(stored):
                return _not_found(response_id)
            return JSONResponse(stored.to_json())

    def _gone(self, stored: StoredResponse) -> bool:
        """A background response created with store=false is kept only for polling: about ten
        minutes after it ended (`unstored_retention_s`) it is not found. Caller holds the lock."""
        ended = stored.ended_at
        return not stored.store and ended is not None and time.time() - ended > self.unstored_retention_s

    async def _cancel(self, request: Request) -> JSONResponse:
        response_id = request.path_params["response_id"]
        await self.arrive("cancel", response_id)
        if self.has_fault(HANG, response_id):
            await self.hang()
        if self.has_fault(CANCEL_500, response_id):
            return _error(500, "The server had an error while processing your request.", kind="server_error")
        if self.has_fault(CANCEL_409, response_id):
            return _error(409, "Cancellation conflicted with the response's current state.")
        with self.lock:
            stored = self._responses.get(response_id)
            if stored is None:
                return _not_found(response_id)
            if not stored.background:
                return _error(400, "Only responses created with background=true can be cancelled.")
            stored.cancel_requests += 1
            self._advance(stored)
            return self._apply_cancel(stored)

    def _apply_cancel(self, stored: StoredResponse) -> JSONResponse:
        """Caller holds the lock and has advanced `stored` to now."""
        if stored.status == "cancelled":
            return JSONResponse(stored.to_json())  # documented as idempotent
        if stored.status in TERMINAL:
            if self.cancel_on_terminal == "200":
                return JSONResponse(stored.to_json())
            return _error(409, f"Cannot cancel a response with status '{stored.status}'.")
        if self._has_fault_locked(IGNORE_CANCEL, [stored.id]):
            stored.cancel_ignored = True
            return JSONResponse(stored.to_json())
        self._set_status(stored, "cancelled")
        if self._has_fault_locked(FLIP_TO_COMPLETED, [stored.id]):
            stored.flip_at = time.monotonic() + self.flip_after_s
        return JSONResponse(stored.to_json())

    async def _unsupported(self, request: Request) -> JSONResponse:
        # Deliberately absent upstream: there is no way to list responses.
        await self.arrive("list")
        return _error(405, "Method not allowed.")

    # --- the scripted model ------------------------------------------------------------

    def _script_for(self, body: dict[str, Any]) -> sm.Script | JSONResponse | None:
        name = sm.script_name(str(body.get("model", "")))
        if name is None:
            return None
        with self.lock:
            script = self._scripts.get(name)
        if script is None:
            return _error(404, f"The model `{body['model']}` does not exist.", param="model")
        return script

    def _log(self, endpoint: str, script: sm.Script, turn: int, **extra: Any) -> None:
        self._model_log.append({"endpoint": endpoint, "script": script.name, "turn": turn, **extra})

    async def _scripted_responses(self, script: sm.Script, body: dict[str, Any]) -> JSONResponse | StreamingResponse:
        index, turn = script.turn_for(body.get("input"))
        stream = bool(body.get("stream"))
        with self.lock:
            self._log("responses", script, index, stream=stream)
        await anyio.sleep(turn.delay_s)
        response_id = f"resp_{uuid.uuid4().hex}"
        final = sm.response_object(
            response_id=response_id,
            model=str(body["model"]),
            output=sm.responses_output(turn, response_id=response_id),
            status="completed",
            created_at=time.time(),
        )
        if not stream:
            return JSONResponse(final)
        return _sse(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in sm.responses_events(final))

    async def _chat_completions(self, request: Request) -> JSONResponse | StreamingResponse:
        await self.arrive("chat")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Request body is not valid JSON.")
        if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
            return _error(400, "Missing required parameter: 'model' or 'messages'.", param="messages")
        script = self._script_for(body)
        if isinstance(script, JSONResponse):
            return script
        if script is None:
            return _error(404, f"The model `{body['model']}` does not exist; use a script:<name>.", param="model")
        index, turn = script.turn_for(body["messages"])
        stream = bool(body.get("stream"))
        with self.lock:
            self._log("chat", script, index, stream=stream)
        await anyio.sleep(turn.delay_s)
        model = str(body["model"])
        if not stream:
            return JSONResponse(sm.chat_completion(turn, model=model))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = sm.chat_chunks(turn, model=model, include_usage=usage)
        return _sse(itertools.chain((f"data: {json.dumps(c)}\n\n" for c in chunks), ["data: [DONE]\n\n"]))

    async def _messages(self, request: Request) -> JSONResponse | StreamingResponse:
        """Anthropic's Messages API (what the Claude Code CLI calls), answered by a script."""
        await self.arrive("messages")
        try:
            body = await request.json()
        except ValueError:
            return _anthropic_error(400, "invalid_request_error", "Request body is not valid JSON.")
        if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
            return _anthropic_error(400, "invalid_request_error", "model: Field required; messages: Field required")
        name = sm.messages_script_name(body)
        with self.lock:
            script = self._scripts.get(name or "")
        if script is None:
            return _anthropic_error(404, "not_found_error", f"model: {body['model']}")
        index, turn = script.turn_for(body["messages"])
        stream = bool(body.get("stream"))
        with self.lock:
            self._log("messages", script, index, stream=stream)
        await anyio.sleep(turn.delay_s)
        answer = sm.messages_answer(turn, model=str(body["model"]))
        if not stream:
            return JSONResponse(answer)
        return _sse(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in sm.messages_events(answer))

    # --- control endpoints beyond the common ones ------------------------------------

    async def _control_scripts(self, request: Request) -> JSONResponse:
        try:
            model = self.load_script(sm.Script.from_json(await request.json()))
        except (KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"model": model})

    async def _control_responses(self, request: Request) -> JSONResponse:
        return JSONResponse({"data": self.responses()})

    async def _control_webhooks(self, request: Request) -> JSONResponse:
        return JSONResponse({"data": self.webhooks_sent()})

    async def _control_arm(self, request: Request) -> JSONResponse:
        body = await request.json()
        try:
            self.arm(body["fault"], int(body.get("times", 1)))
        except (KeyError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"armed": body["fault"]})

    async def _control_finish(self, request: Request) -> JSONResponse:
        body = await request.json()
        try:
            return JSONResponse(self.finish(request.path_params["response_id"], body.get("status", "completed")))
        except KeyError:
            return JSONResponse({"error": "unknown response"}, status_code=404)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/responses", self._create, methods=["POST"]),
                Route("/v1/responses", self._unsupported, methods=["GET"]),
                Route("/v1/responses/{response_id}", self._retrieve, methods=["GET"]),
                Route("/v1/responses/{response_id}/cancel", self._cancel, methods=["POST"]),
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/_control/scripts", self._control_scripts, methods=["POST"]),
                *self.control_routes(),
                Route("/_control/responses", self._control_responses, methods=["GET"]),
                Route("/_control/arm", self._control_arm, methods=["POST"]),
                Route("/_control/webhooks", self._control_webhooks, methods=["GET"]),
                Route("/_control/responses/{response_id}/finish", self._control_finish, methods=["POST"]),
            ]
        )


def _message(response_id: str, text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{response_id.removeprefix('resp_')}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _sse(frames: Iterator[str]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        for frame in frames:
            yield frame

    return StreamingResponse(body(), media_type="text/event-stream")


def _usage() -> dict[str, Any]:
    return {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 20,
    }


def _summarise(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text[:80]


def _error(status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def _anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def _not_found(response_id: str) -> JSONResponse:
    return _error(404, f"Response with id '{response_id}' not found.", param="response_id")


# What the sandbox's start-all and the drills' sandbox find through the mechanism folders.
PARTY = OpenAIStandin
PARTY_NAME = "openai"  # its key in `Sandbox.urls` and the name of its server
URL_SUFFIX = "/v1"  # what a client's base URL adds to the server's
# (method, path) patterns that are actions, work that must pass the boundary first (the drills
# time them against Stop); reads, lookups and cancels are what Stop itself sends afterwards.
ACTIONS = [("POST", re.compile(r"^/v1/responses$"))]
DRILL_OPTIONS: dict[str, float] = {
    "queue_s": 0.02,
    "run_s": 30.0,
    "flip_after_s": 0.3,
}  # how the drills' sandbox builds it
