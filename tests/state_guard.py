"""The suite's guard on state writes: every SQL statement any test's connection runs (threads
included) is read, and one that writes a machine's state column from outside that machine's one
writer fails the test.

It reads the SQL the database is sent, so it sees every spelling alike: `.update(state=...)` on
any queryset, `setattr` then `save()`, `bulk_update(..., ["state"])`, a constructor or `create`
with a state other than the initial one, and raw SQL however it is quoted, cased or assembled
(f-strings, data-modifying CTEs). A statement writes the state when it is an UPDATE of the table
whose SET list names the column, or an INSERT whose column list has it with a value other than the
initial state (or a value the guard cannot read, as in INSERT ... SELECT). It is allowed when a
frame of the machine's writer is on the call stack; migrations may write too (history), and so may
`tests.factories.set_state_by_hand`, for a test that needs a row no writer would leave.

Not seen: workers in other processes, and SQL sent on a raw DB-API cursor that bypasses Django's.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stopdesk
from stopdesk.states import CompensationState, DeliveryState, ItemState

# As the modules were imported (code objects carry that spelling of their file, symlinks and all).
ROOT = Path(stopdesk.__file__).parents[1]


class StateWriteOutsideWriter(AssertionError):
    """A statement wrote a state column from outside the machine's one writer."""


@dataclass(frozen=True)
class Machine:
    table: str
    initial: str
    # A frame is the writer's when its file is under `package`, or is `module` and runs `functions`.
    package: Path | None = None
    module: Path | None = None
    functions: frozenset[str] = frozenset()
    column: str = "state"

    def writes_here(self, filename: str, function: str) -> bool:
        # String comparisons: this runs for every frame of every state write in the suite.
        if self.package is not None and filename.startswith(f"{self.package}{os.sep}"):
            return True
        return self.module is not None and filename == str(self.module) and function in self.functions


MACHINES = (
    Machine("stopdesk_workitem", ItemState.QUEUED, package=ROOT / "stopdesk" / "services" / "transitions"),
    Machine(
        "reconcile_compensation",
        CompensationState.PROPOSED,
        module=ROOT / "reconcile" / "services" / "compensation.py",
        functions=frozenset({"compensation_move"}),
    ),
    Machine(
        "notify_delivery",
        DeliveryState.PENDING,
        module=ROOT / "stopdesk" / "notify" / "delivery.py",
        functions=frozenset({"delivery_move"}),
    ),
)
MIGRATIONS = f"{os.sep}migrations{os.sep}"
# The one test helper that may put a row in a state by hand (tests/factories.py).
BY_HAND = (str(ROOT / "tests" / "factories.py"), "set_state_by_hand")

# --- reading the SQL -----------------------------------------------------------------------------

_LITERAL = re.compile(r"'(?:[^']|'')*'")
_PLACEHOLDER = re.compile(r"\(?(?:%\((\w+)\)s|(%s|\?))\)?(?:::[\w\[\]]+)?")


def _unquote(sql: str) -> tuple[str, list[str]]:
    """Lower-case the SQL, drop identifier quotes, and replace each string literal by `'#n'`
    (the literals are returned, so a literal value can still be read)."""
    literals: list[str] = []

    def keep(match: re.Match[str]) -> str:
        literals.append(match.group(0)[1:-1].replace("''", "'"))
        return f"'#{len(literals) - 1}'"

    sql = _LITERAL.sub(keep, sql)
    return re.sub(r'["`\[\]]', "", sql.lower()), literals


def _split_top(text: str, *, stop: re.Pattern[str] | None = None) -> list[str]:
    """Split on commas outside parentheses; end at a closing parenthesis that was not opened, or at
    `stop` matched outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        elif depth == 0 and stop is not None and stop.match(text, i):
            break
        i += 1
    parts.append(text[start:i])
    return [p.strip() for p in parts]


_SET_END = re.compile(r"\b(where|returning|from)\b")


def _table(machine: Machine) -> str:
    return rf"(?:\w+\.)?{re.escape(machine.table)}\b"


def _updates_column(sql: str, machine: Machine) -> bool:
    found = re.finditer(rf"\bupdate\s+(?:only\s+)?{_table(machine)}(?:\s+(?:as\s+)?(?!set\b)\w+)?\s+set\b", sql)
    for match in found:
        for assignment in _split_top(sql[match.end() :], stop=_SET_END):
            target = assignment.split("=", 1)[0].strip()
            names = [n.strip().rsplit(".", 1)[-1] for n in target.strip("()").split(",")]
            if machine.column in names:
                return True
    return False


def _inserts_other_than_initial(sql: str, literals: list[str], params: Any, machine: Machine) -> bool:
    for match in re.finditer(rf"\binsert\s+(?:or\s+\w+\s+)?into\s+{_table(machine)}\s*\(", sql):
        columns = [c.rsplit(".", 1)[-1] for c in _split_top(sql[match.end() :])]
        if machine.column not in columns:
            continue
        at = columns.index(machine.column)
        rest = sql[match.end() :]
        if re.match(r"[^)]*\)\s*select\s+\*\s+from\s+unnest\s*\(", rest) and isinstance(params, (list, tuple)):
            # Django's bulk insert on PostgreSQL: one array parameter per column.
            if any(value != machine.initial for value in params[at]):
                return True
            continue
        values = re.match(r"[^)]*\)\s*values\s*", rest)
        if values is None:
            return True  # INSERT ... SELECT: the value cannot be read here
        if any(value != machine.initial for value in _inserted(rest[values.end() :], at, literals, params)):
            return True
    return False


def _inserted(text: str, at: int, literals: list[str], params: Any) -> Iterator[Any]:
    """The values at position `at` of each row of a VALUES list, read from literals or params."""
    positional = iter(params) if isinstance(params, (list, tuple)) else iter(())
    while (row := re.match(r"\s*,?\s*\(", text)) is not None:
        cells = _split_top(text[row.end() :])
        for i, cell in enumerate(cells):
            placeholder = _PLACEHOLDER.fullmatch(cell)
            literal = re.fullmatch(r"'#(\d+)'(?:::\w+)?", cell)
            if placeholder is not None:
                name = placeholder.group(1)
                value = params[name] if name is not None else next(positional, None)
            elif literal is not None:
                value = literals[int(literal.group(1))]
            else:
                # An expression: not a value the guard can read; its parameters are skipped.
                for _ in re.findall(r"%s|\?", cell):
                    next(positional, None)
                value = object()
            if i == at:
                yield value
        depth, j = 1, row.end()
        while depth and j < len(text):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        text = text[j:]


def machines_written(sql: str, params: Any) -> list[Machine]:
    """The machines whose state this statement writes (other than an insert in the initial state)."""
    lowered = sql.lower()
    if not any(m.table in lowered for m in MACHINES):
        return []
    text, literals = _unquote(sql)
    return [
        m
        for m in MACHINES
        if m.table in text and (_updates_column(text, m) or _inserts_other_than_initial(text, literals, params, m))
    ]


# --- the call stack ------------------------------------------------------------------------------


def _from_writer(machine: Machine) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        here = code.co_filename
        if machine.writes_here(here, code.co_name) or MIGRATIONS in here or (here, code.co_name) == BY_HAND:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


# --- the wrapper ---------------------------------------------------------------------------------

found: list[str] = []
_lock = threading.Lock()


def guard(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    rows: Sequence[Any] = list(params) if many and params is not None else [params]
    for machine in {m for row in rows for m in machines_written(sql, row)}:
        if not _from_writer(machine):
            problem = f"{machine.table}.{machine.column} written outside its writer: {' '.join(sql.split())[:300]}"
            with _lock:
                found.append(problem)
            raise StateWriteOutsideWriter(problem)
    return execute(sql, params, many, context)


def install(connection: Any, **_: Any) -> None:
    if guard not in connection.execute_wrappers:
        # First in the list: a `with connection.execute_wrapper(...)` open at connect time pops the last.
        connection.execute_wrappers.insert(0, guard)


def take_found() -> list[str]:
    with _lock:
        taken = list(found)
        found.clear()
    return taken
