"""Encrypted job data at rest: the arguments, result, checkpoint and error texts of a job
class with ``encrypted = True``.

A sealed value is stored as a JSON object, so its column stays valid JSON for everything
that reads rows without decrypting them (the admin, pruning, the dead-job screen)::

    {"__gator_encrypted__": "<key id>", "data": "<Fernet token of the value's JSON>"}

The keys are ``GATOR_ENCRYPTION_KEYS``, newest first, each a URL-safe base64 text of 32
random bytes (what ``cryptography.fernet.Fernet.generate_key()`` returns). The newest
seals; every key in the list opens what it sealed, so a new key can be put first while
rows sealed with the older ones are still around (``gator_rotate_keys`` re-seals them). A
key id is the start of a SHA-256 digest of the key: it names the key in errors and in the
envelope without revealing it.

Fernet (from the optional ``cryptography`` package, ``pip install django-gator[encryption]``)
is AES-128-CBC with an HMAC-SHA256 over the whole token: a changed byte of a token fails
to open, so a tampered row is refused, never decrypted into garbage.

Unique keys of encrypted jobs are stored as a keyed digest (HMAC-SHA256 under a key derived
from the newest key): two dispatches with the same key still collide, and the row does not
show the key (:func:`digest`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
from dataclasses import dataclass
from typing import Any

from django_gator import conf
from django_gator.exceptions import EncryptionUnavailable, Undecryptable

#: The envelope's key naming the key that sealed it.
MARK = "__gator_encrypted__"
#: What anyone who may not read an encrypted value sees instead of it.
SHOWN = "[encrypted]"
#: Characters of a key id (hex digits of the key's SHA-256).
KEY_ID_CHARS = 12


def key_id(key: str | bytes) -> str:
    """The id of a key as GATOR_ENCRYPTION_KEYS holds it (its base64 text)."""
    raw = key.encode("ascii") if isinstance(key, str) else key
    return hashlib.sha256(b"django-gator key id:" + raw.strip()).hexdigest()[:KEY_ID_CHARS]


def key_problem(key: Any) -> str | None:
    """Why ``key`` is not a usable encryption key, or None."""
    if not isinstance(key, str | bytes):
        return f"must be a URL-safe base64 text of 32 bytes, got {type(key).__name__}"
    try:
        raw = base64.urlsafe_b64decode(key)
    except (binascii.Error, ValueError):
        return "is not URL-safe base64 (generate one with Fernet.generate_key())"
    if len(raw) != 32:
        return f"decodes to {len(raw)} bytes, not 32 (generate one with Fernet.generate_key())"
    return None


def unavailable() -> str | None:
    """Why nothing can be sealed now (no cryptography package, no keys, a bad key), or
    None. Named in the system check and in the error of a refused dispatch."""
    try:
        import cryptography.fernet  # noqa: F401
    except ImportError:
        return "the cryptography package is not installed (pip install 'django-gator[encryption]')"
    keys = conf.encryption_keys()
    if not keys:
        return "GATOR_ENCRYPTION_KEYS is empty"
    for index, key in enumerate(keys):
        problem = key_problem(key)
        if problem is not None:
            return f"GATOR_ENCRYPTION_KEYS[{index}] {problem}"
    return None


@dataclass(frozen=True)
class Keyring:
    """The Fernet of each key, by key id; ``newest``: the id of the key that seals."""

    newest: str
    fernets: dict[str, Any]
    digest_key: bytes

    def seal(self, text: str) -> dict[str, str]:
        token = self.fernets[self.newest].encrypt(text.encode("utf-8"))
        return {MARK: self.newest, "data": token.decode("ascii")}


_lock = threading.Lock()
_cache: tuple[tuple[Any, ...], Keyring] | None = None


def keyring() -> Keyring:
    """The keys of GATOR_ENCRYPTION_KEYS (built once per value of the setting);
    EncryptionUnavailable when they cannot be used."""
    global _cache
    keys = tuple(conf.encryption_keys())
    cached = _cache
    if cached is not None and cached[0] == keys:
        return cached[1]
    problem = unavailable()
    if problem is not None:
        raise EncryptionUnavailable(f"cannot encrypt job data: {problem}")
    from cryptography.fernet import Fernet

    fernets: dict[str, Any] = {}
    for key in keys:
        fernets.setdefault(key_id(key), Fernet(key))
    raw = base64.urlsafe_b64decode(keys[0])
    digest_key = hmac.new(raw, b"django-gator unique keys", hashlib.sha256).digest()
    ring = Keyring(key_id(keys[0]), fernets, digest_key)
    with _lock:
        _cache = (keys, ring)
    return ring


def is_sealed(value: Any) -> bool:
    """Whether ``value`` (as read from a JSON column) is a sealed envelope."""
    return type(value) is dict and MARK in value


def seal_text(text: str) -> dict[str, str]:
    """The envelope of ``text`` (a JSON text), sealed with the newest key."""
    return keyring().seal(text)


def envelope_json(envelope: dict[str, str]) -> str:
    """The JSON text of an envelope, as a column stores it."""
    return json.dumps(envelope, separators=(",", ":"))


def seal_json(text: str) -> str:
    """``text`` (a JSON text) sealed, as the JSON text of its envelope."""
    return envelope_json(keyring().seal(text))


def seal_value(value: Any) -> dict[str, str]:
    """The envelope of ``value`` (JSON-able)."""
    return seal_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def seal_fields(text: str, names: tuple[str, ...]) -> str:
    """``text`` (the JSON of a kwargs dict) with the values under ``names`` sealed, each in
    an envelope of its own (``encrypted = ["email", ...]``)."""
    kwargs = json.loads(text)
    for name in names:
        if name in kwargs:
            kwargs[name] = seal_value(kwargs[name])
    return json.dumps(kwargs, separators=(",", ":"), ensure_ascii=False)


def holds_sealed(value: Any) -> bool:
    """Whether ``value`` is sealed, or a dict with a sealed value (listed kwargs)."""
    return is_sealed(value) or (type(value) is dict and any(map(is_sealed, value.values())))


def open_fields(value: Any, what: str) -> Any:
    """:func:`open_value`, and a dict's sealed values opened one by one."""
    if type(value) is dict and not is_sealed(value):
        if any(map(is_sealed, value.values())):
            return {k: open_value(v, f"{what} ({k!r})") for k, v in value.items()}
        return value
    return open_value(value, what)


def open_value(value: Any, what: str) -> Any:
    """The value ``value`` holds: itself if it is not sealed, else what its envelope
    opens to. Undecryptable (naming ``what`` and the key id) when its key is not in
    GATOR_ENCRYPTION_KEYS or its token was changed."""
    if not is_sealed(value):
        return value
    kid = value.get(MARK)
    token = value.get("data")
    try:
        ring = keyring()
    except EncryptionUnavailable as exc:
        raise Undecryptable(
            f"{what} (encrypted with key id {kid!r}) cannot be decrypted: {exc}", key_id=str(kid)
        ) from None
    fernet = ring.fernets.get(kid) if isinstance(kid, str) else None
    if fernet is None:
        raise Undecryptable(
            f"{what} cannot be decrypted: key id {kid!r} is not in GATOR_ENCRYPTION_KEYS "
            "(add that key back, after the newest, and retry the job)",
            key_id=str(kid),
        )
    from cryptography.fernet import InvalidToken

    try:
        if not isinstance(token, str):
            raise InvalidToken
        return json.loads(fernet.decrypt(token.encode("ascii")))
    except (InvalidToken, UnicodeError, ValueError):
        raise Undecryptable(
            f"{what} cannot be decrypted with key id {kid!r}: its ciphertext was changed "
            "(it fails the token's authentication), so it is not used",
            key_id=str(kid),
        ) from None


def reseal(value: Any, ring: Keyring, what: str) -> Any:
    """``value`` sealed with the newest key: an envelope of an older key opened and sealed
    again, anything else as it is."""
    if not is_sealed(value) or value.get(MARK) == ring.newest:
        return value
    opened = open_value(value, what)
    return ring.seal(json.dumps(opened, separators=(",", ":"), ensure_ascii=False))


def digest(key: str) -> str:
    """The unique key of an encrypted job as its row stores it: an HMAC of ``key`` (what
    unique_key() returned) under the newest key, named by its key id."""
    ring = keyring()
    mac = hmac.new(ring.digest_key, key.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"hmac:{ring.newest}:{mac}"


def open_payload(job_id: int, name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """A job's (args, kwargs) opened (those not sealed as they are); Undecryptable naming
    the job and the key id."""
    what = f"job {job_id} ({name})"
    return open_value(args, f"the arguments of {what}"), open_fields(
        kwargs, f"the kwargs of {what}"
    )


#: The fields of an error-history entry that may hold an encrypted job's data.
ERROR_FIELDS = ("message", "traceback")


def seal_error(entry_json: str, summary: str) -> tuple[str, str]:
    """An error-history entry of an encrypted job (the JSON of error_entry()) with its
    message and traceback sealed, and the ``last_error`` summary that goes with it: the
    exception's class, the message shown as SHOWN. The summary is what log lines, the
    admin's list and its search see."""
    entry = json.loads(entry_json)
    for field in ERROR_FIELDS:
        if isinstance(entry.get(field), str) and entry[field]:
            entry[field] = seal_value(entry[field])
    cls = entry.get("class")
    shown = f"{cls}: {SHOWN}" if cls else SHOWN
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False), shown if summary else ""
