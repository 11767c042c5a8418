"""The environment readers the settings modules share; reading this module reads no setting.

``env`` is django-environ's reader (``.env`` is loaded by the process section of
``knowledgefs.settings.platform``). ``bounded_int`` refuses a malformed or out-of-range integer
at start-up, naming the variable; ``_with_alias`` picks a variable or its compatibility alias.
``scripts/settings_table.py`` recognises the settings modules' reads by these names (``env.str``,
``bounded_int(...)``, ``_with_alias(...)``): import them by name, never under another.
"""

from __future__ import annotations

import environ
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()


def bounded_int(name: str, default: int, low: int, high: int) -> int:
    """Read an integer setting and refuse values outside ``[low, high]`` at start-up, naming the
    variable, the value and the range (unset or empty → ``default``)."""
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.lstrip("-").isdigit()):
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a whole number; accepted range {low}..{high}"
        )
    value = int(raw)
    if not low <= value <= high:
        raise ImproperlyConfigured(f"{name}={value} is outside the accepted range {low}..{high}")
    return value


def _with_alias(name: str, alias: str) -> str:
    """``name`` when it is set, else its lower-precedence compatibility ``alias`` when that is."""
    return (
        name
        if env.str(name, default="").strip() or not env.str(alias, default="").strip()
        else alias
    )
