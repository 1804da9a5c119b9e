"""Log-safe rendering of values that come from users or rows."""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def safe(value: object, limit: int = 200) -> str:
    """``value`` as text with control characters escaped (no forged lines, no terminal
    escapes), cut to ``limit`` characters."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
