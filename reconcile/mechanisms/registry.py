"""Which adapter handles which `WorkItem.mechanism`, built with its settings."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from reconcile.mechanisms.base import Mechanism, MechanismSettings

_CLASSES: dict[str, type[Mechanism]] = {}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: make an adapter available under its `name`."""
    _CLASSES[cls.name] = cls
    get.cache_clear()
    return cls


def names() -> list[str]:
    _load_builtin()
    return sorted(_CLASSES)


def mechanism_settings(name: str) -> MechanismSettings:
    _load_builtin()
    cls = _CLASSES.get(name)
    base = cls.defaults if cls is not None else MechanismSettings()
    overrides = getattr(settings, "STOPDESK_MECHANISMS", {}).get(name, {})
    return base.merged(overrides)


@cache
def get(name: str) -> Mechanism:
    """The adapter for `name`; unknown mechanisms get the manual rule (wait for a report)."""
    _load_builtin()
    cls = _CLASSES.get(name) or _CLASSES["manual"]
    return cls(mechanism_settings(name))


def timing_problems() -> list[str]:
    """Each mechanism's timing as configured, checked whole: a call that may outlast the deadline
    would let the deadline pass while we still wait on the call."""
    from stopdesk.config import timing_variable

    _load_builtin()
    problems = []
    for name in sorted(_CLASSES):
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


def _load_builtin() -> None:
    if "manual" in _CLASSES:
        return
    # Imported for their @register side effect; here rather than at the top so that an adapter
    # module can import this one.
    from reconcile.mechanisms import aio, celery, http, manual, mcp, openai  # noqa: F401


def _on_setting_changed(*, setting: str, **_: object) -> None:
    if setting in ("STOPDESK_MECHANISMS", "STOPDESK"):
        reset()


from django.core.signals import setting_changed  # noqa: E402

setting_changed.connect(_on_setting_changed, dispatch_uid="reconcile.mechanisms.registry")
