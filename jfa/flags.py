"""Boolean switches read from the environment, parsed one way everywhere.

``"0"``, ``"1"``, ``"true"``, ``"false"`` (any case, surrounding spaces ignored); an unset or empty
variable means the default; anything else is a ValueError naming the variable, so that a typo never
silently means "off"."""
from __future__ import annotations

import os

_VALUES = {"0": False, "false": False, "1": True, "true": True}


def parse_bool(value: str, source: str) -> bool:
    """``value`` as a switch; ValueError naming ``source`` (a variable, or "VARIABLE: key") otherwise."""
    try:
        return _VALUES[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{source}: must be 0, 1, true or false, got {value!r}") from None


def env_flag(name: str, default: bool) -> bool:
    """The switch in environment variable ``name`` (read at each call), ``default`` when unset or empty."""
    value = os.environ.get(name, "")
    return default if not value.strip() else parse_bool(value, name)
