"""Small helpers for user-facing English: ``1 job`` / ``2 jobs``, ``a set`` / ``an int``."""

from __future__ import annotations

# Words starting with a vowel letter but a consonant sound ("a unique key", "a uuid.UUID").
_CONSONANT_SOUND = ("uni", "use", "usi", "usu", "uti", "uu", "one", "eu")
# Words starting with a consonant letter but a vowel sound.
_VOWEL_SOUND = ("hour", "honest")


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``count(1, "job")`` is ``"1 job"``, ``count(2, "dead job")`` is ``"2 dead jobs"``;
    numbers get thousands separators. Pass ``plural`` for irregular nouns."""
    word = noun if number == 1 else (plural or _plural(noun))
    return f"{number:,} {word}"


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "o", "u", ""):
        return noun[:-1] + "ies"
    return noun + "s"


def article(word: str) -> str:
    """``word`` with ``a`` or ``an`` before it, by how it is usually said:
    ``an int``, ``an orders.models.Order``, ``a set``, ``a uuid.UUID``."""
    lower = word.lower()
    vowel = lower[:1] in ("a", "e", "i", "o", "u")
    if vowel and lower.startswith(_CONSONANT_SOUND):
        vowel = False
    elif not vowel and lower.startswith(_VOWEL_SOUND):
        vowel = True
    return f"{'an' if vowel else 'a'} {word}"


def age(seconds: float) -> str:
    """A duration, short: ``0.4s``, ``42s``, ``5m07s``, ``3h02m``, ``2d04h``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
