"""Which adapter handles which `WorkItem.mechanism`, built with its settings.

The mechanisms are the folders listed in `folders.FOLDERS`; a folder's adapter is imported when
first used, so naming a mechanism (item registration checks the name) does not load the OpenAI and
MCP SDKs. Adapter modules do not import this one: the table points one way.
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.core.signals import setting_changed

from reconcile.mechanisms import folders
from reconcile.mechanisms.base import Mechanism, MechanismSettings
from stopdesk.config import timing_variable

_EXTRA: dict[str, type[Mechanism]] = {}


class UnknownMechanism(LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"Unknown mechanism {name!r}; expected one of {', '.join(names())}.")


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Make an adapter without a folder available under its `name` (a class decorator)."""
    if folders.package(cls.name) is not None or _EXTRA.get(cls.name, cls) is not cls:
        raise ValueError(f"A mechanism named {cls.name!r} is already registered.")
    _EXTRA[cls.name] = cls
    get.cache_clear()
    return cls


def unregister(name: str) -> None:
    _EXTRA.pop(name, None)
    get.cache_clear()


def names() -> list[str]:
    return sorted({*folders.names(), *_EXTRA})


def known(name: str) -> bool:
    return folders.package(name) is not None or name in _EXTRA


def adapter_class(name: str) -> type[Mechanism]:
    if name in _EXTRA:
        return _EXTRA[name]
    if folders.package(name) is None:
        raise UnknownMechanism(name)
    adapter = folders.part(name, "adapter")
    if adapter is None:
        raise UnknownMechanism(name)
    cls: type[Mechanism] = adapter.ADAPTER
    return cls


def mechanism_settings(name: str) -> MechanismSettings:
    overrides = getattr(settings, "STOPDESK_MECHANISMS", {}).get(name, {})
    return adapter_class(name).defaults.merged(overrides)


@cache
def get(name: str) -> Mechanism:
    """The adapter for `name`. An unknown name is an error: item registration refuses it, so an
    item in the ledger always names an adapter that exists."""
    return adapter_class(name)(mechanism_settings(name), peers=get)


def timing_problems() -> list[str]:
    """Each mechanism's timing as configured, checked whole: a call that may outlast the deadline
    would let the deadline pass while we still wait on the call."""
    problems = []
    for name in names():
        timing = mechanism_settings(name)
        if timing.call_timeout_s >= timing.deadline_s:
            problems.append(
                f"{timing_variable(name, 'call_timeout_s')}={timing.call_timeout_s:g} must be shorter than "
                f"{timing_variable(name, 'deadline_s')}={timing.deadline_s:g}."
            )
    return problems


def reset() -> None:
    """Forget built adapters, e.g. after settings changed in a test."""
    get.cache_clear()


def _on_setting_changed(*, setting: str, **_: object) -> None:
    if setting in ("STOPDESK_MECHANISMS", "STOPDESK"):
        reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="reconcile.mechanisms.registry")
