"""Reading values that arrive as rendered templates ("True", "false", "2") in operator fields."""

from __future__ import annotations

from datetime import timedelta

_TRUE = {"true", "1", "yes", "on"}


def as_bool(value: object) -> bool:
    """``True`` for ``True`` or a string like ``"True"``/``"1"``/``"yes"`` (how a Jinja-rendered flag arrives)."""
    return value is True or str(value).strip().lower() in _TRUE


def as_seconds(value: timedelta | float | str) -> float:
    """Seconds from a ``timedelta``, a number or a rendered template (``"600"``)."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
