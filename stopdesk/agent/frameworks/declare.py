"""What a tool does, declared once where the tool is defined.

    @declare(read_only=True)
    async def lookup(q: str) -> str: ...

    @declare(system="crm", idempotency_key=lambda args: f"lead-{args['name']}", reversible="archive")
    async def create_lead(name: str) -> str: ...

A declared external action passes the boundary by *submitting* its idempotency key before the body
runs, so a Stop that lands while it is in flight is reconciled by looking the key up. An undeclared
tool is treated as possibly destructive: if Stop interrupts it, it is recorded uncertain (with an
investigate-by deadline), never "cancelled", because nobody said it had no effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Effect = Literal["read_only", "reversible", "irreversible", "unknown"]
ATTRIBUTE = "__stopdesk_tool__"
UNWRAP_LIMIT = 20  # a chain of `__wrapped__` longer than any stack of decorators, but never a loop


@dataclass(frozen=True)
class ToolDeclaration:
    effect: Effect = "unknown"
    reversal: str = ""  # how to undo it, for a reversible tool
    system: str = ""  # the external system it acts on; set means an external action
    idempotency_key: Callable[[dict[str, Any]], str] | None = None
    http: dict[str, Any] = field(default_factory=dict)  # {"effect": ...}: an http operation on the configured `system`
    noun: str = ""  # what the summary calls one call ("lead", "email"); default "<tool> call"

    @property
    def external(self) -> bool:
        return bool(self.system)

    @property
    def read_only(self) -> bool:
        return self.effect == "read_only"

    @property
    def declared(self) -> bool:
        """Whether anybody said what the tool does (an undeclared tool is possibly destructive)."""
        return self.effect != "unknown" or self.external

    def as_detail(self) -> dict[str, Any]:
        """What the ledger keeps, so the summary, the review queue and readiness can read it
        (`reconcile.readiness.declared_verdict` reads these keys from each call's `detail.tool`)."""
        out: dict[str, Any] = {"effect": self.effect, "declared": self.declared}
        if self.reversal:
            out["reversal"] = self.reversal
        if self.system:
            out["system"] = self.system
            out["keyed"] = self.idempotency_key is not None
        return out


UNDECLARED = ToolDeclaration()


def declare[F: Callable[..., Any]](
    fn: F | None = None,
    *,
    read_only: bool = False,
    reversible: str = "",
    irreversible: bool = False,
    system: str = "",
    idempotency_key: Callable[[dict[str, Any]], str] | None = None,
    http: dict[str, Any] | None = None,
    noun: str = "",
) -> Any:
    """Decorator (bare or with arguments) recording what a tool does on the function itself."""
    chosen = [read_only, bool(reversible), irreversible]
    if sum(chosen) > 1:
        raise ValueError("declare one of read_only, reversible=<how> or irreversible")
    if read_only and system:
        raise ValueError("a read-only tool has no external action; drop system= or read_only")
    if system and idempotency_key is None:
        raise ValueError(f"an external action on {system!r} needs idempotency_key= (a function of the arguments)")
    effect: Effect = (
        "read_only" if read_only else "reversible" if reversible else "irreversible" if irreversible else "unknown"
    )
    declaration = ToolDeclaration(effect, reversible, system, idempotency_key, dict(http or {}), noun)

    def apply(target: F) -> F:
        setattr(target, ATTRIBUTE, declaration)
        return target

    return apply(fn) if fn is not None else apply


def declaration_of(obj: Any) -> ToolDeclaration:
    """The declaration on `obj`, or on what it wraps: a decorator that keeps `__wrapped__` (as
    `functools.wraps` and the Agents SDK's `FunctionTool` do) may sit above or below `@declare`."""
    for _ in range(UNWRAP_LIMIT):
        found = getattr(obj, ATTRIBUTE, None)
        if isinstance(found, ToolDeclaration):
            return found
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            break
    return UNDECLARED


def first_declaration(*candidates: Any) -> ToolDeclaration:
    """The first declaration that says something among the objects a framework keeps for one tool
    (its tool object, the function it was made from), so a declaration counts whichever of them
    `@declare` decorated."""
    for candidate in candidates:
        found = declaration_of(candidate)
        if found.declared:
            return found
    return UNDECLARED
