"""Secrets never leave the process: masked in log records, MLflow parameters and tags, and written summaries.

Two rules, applied together:

- **By name**: a value whose key looks secret (``hf_token``, ``password``, ``api_key``,
  ``aws_secret_access_key``, ``credentials``, ``auth`` ...) is replaced by ``***`` whatever it holds. Words
  are matched whole, so ``max_tokens``, ``tokenizer``, ``pad_token`` or ``train_tokens`` stay visible.
- **By shape**: anywhere in any text, Hugging Face / GitHub / OpenAI-style tokens, AWS access key ids,
  ``Bearer`` tokens, ``secret=...`` pairs and the credentials of ``scheme://user:password@host`` and
  ``scheme://user@host`` URIs are masked; the scheme, host and path stay readable
  (``https://***:***@host/path``). So are the forms a path class makes of a URI (``PurePosixPath`` turns
  ``//`` into ``/``: ``https:/user:pw@host``; a Windows path, a backslash; fsspec drops the scheme:
  ``user:pw@host/path``). Code that normalises a path-like value for a message masks it first
  (:func:`shown_location`); the shapes above are the net for what it missed.

Kedro-free and dependency-free: the log filter is installed at start-up (``fastlm.settings``), the MLflow hook
and the train summary call :func:`redact` on what they write.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastlm.errors import exception_chain

MASK = "***"

_SECRET_WORDS = {
    "token",
    "password",
    "passwd",
    "pwd",
    "secret",
    "apikey",
    "credential",
    "credentials",
    "auth",
    "authorization",
    "passphrase",
    "cookie",
    "privatekey",
}
_SECRET_PAIRS = {
    ("api", "key"),
    ("access", "key"),
    ("private", "key"),
    ("secret", "key"),
    ("client", "secret"),
}
_NOT_SECRET_BEFORE_TOKEN = {
    "pad",
    "eos",
    "bos",
    "unk",
    "sep",
    "cls",
    "mask",
    "special",
    "max",
    "num",
    "added",
}

# scheme, then '//' (or '/' or '\' once a path class normalised it), then everything up to the LAST '@' before
# the host: a password may hold an unencoded '@' (as urllib reads it), none of which may show.
_URI_CREDENTIALS = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*:(?://?|\\{1,2}))"
    r"(?P<credentials>[^/\\\s'\"]+)@"
)
# user:password@host with no scheme left (fsspec strips it: ``https://u:p@host/x`` -> ``u:p@host/x``)
_BARE_CREDENTIALS = re.compile(r"(?<![\w.+%~*-])[\w.+%~-]+:[^\s/\\@'\"]+@(?=[A-Za-z0-9\[])")
_VALUE_PATTERNS = (
    re.compile(r"\bhf_[A-Za-z0-9]{16,}\b"),  # Hugging Face
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),  # GitHub
    re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}\b"),  # OpenAI-style API keys
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),  # AWS access key id
    re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+"),  # JWT
)
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=\-]{8,}")
_KEY_VALUE = re.compile(
    r"(?P<key>[A-Za-z_][\w.\-]*)(?P<kq>['\"]?)(?P<sep>\s*[=:]\s*)(?P<quote>['\"]?)(?P<value>[^\s,;&'\"}]+)"
)


def is_secret_key(key: Any) -> bool:
    """True when the last component of ``key`` (``a.b.hf_token`` -> ``hf_token``) names a secret."""
    name = str(key).rsplit(".", 1)[-1]
    words = [
        word for word in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if word
    ]
    for index, word in enumerate(words):
        if word == "token" and (index == 0 or words[index - 1] not in _NOT_SECRET_BEFORE_TOKEN):
            return True
        if word in _SECRET_WORDS - {"token"} or word == "key" and index == len(words) - 1 and len(words) == 1:
            return True
        if index and (words[index - 1], word) in _SECRET_PAIRS:
            return True
    return False


def redact_text(text: str) -> str:
    """``text`` with every secret-shaped part masked (URIs keep scheme and host)."""
    if not text:
        return text
    text = _URI_CREDENTIALS.sub(_mask_uri, text)
    text = _BARE_CREDENTIALS.sub(f"{MASK}:{MASK}@", text)
    for pattern in _VALUE_PATTERNS:
        text = pattern.sub(MASK, text)
    text = _BEARER.sub(lambda match: f"{match.group(1)}{match.group(2)}{MASK}", text)
    return _KEY_VALUE.sub(_mask_pair, text)


def redact(value: Any, key: Any = None) -> Any:
    """A copy of ``value`` (mappings and sequences followed) with secret keys and secret-shaped strings
    masked.

    Non-string leaves under harmless keys are returned as they are, so numbers stay numbers.
    """
    if key is not None and is_secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {name: redact(item, name) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(item) for item in value)
    return value


def _mask_uri(match: re.Match) -> str:
    has_password = ":" in match.group("credentials")
    return f"{match.group('scheme')}{MASK}{':' + MASK if has_password else ''}@"


def shown_location(value: Any) -> str:
    """``value`` (a path, a URI) as it may be printed: its credentials masked as given, before any path class
    or fsspec normalises it (``https://u:p@host`` -> ``https:/u:p@host`` or ``u:p@host``)."""
    return redact_text(str(value))


# a fix's placeholder for a secret's value (``export HF_TOKEN=...``, ``=<password>``), its closing backtick or
# bracket after it: no secret, and masking it ate the fix's closing backtick
_PLACEHOLDER = re.compile(r"(?:\.\.\.|<\w+>)[`)\]]*")


def _mask_pair(match: re.Match) -> str:
    value = match.group("value")
    if not is_secret_key(match.group("key")) or value == MASK or _PLACEHOLDER.fullmatch(value):
        return match.group(0)
    return f"{match.group('key')}{match.group('kq')}{match.group('sep')}{match.group('quote')}{MASK}"


class RedactingFilter(logging.Filter):
    """A logging filter (for handlers or loggers) that masks secrets in the formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Mask secrets in ``record``'s message (formatted with its arguments first) and exception text."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a broken format string is logging's business, not ours
        return record
    clean = redact_text(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_text:
        record.exc_text = redact_text(record.exc_text)
    return record


_installed = False


def install_log_redaction() -> None:
    """Mask secrets in every log record of the process, whatever handler (Rich, file, pytest) later shows it.

    A log-record factory sees each record once, at creation, before any handler or filter configuration
    (``conf/logging.yml``, ``KEDRO_LOGGING_CONFIG``) can route it around a handler-level filter. Idempotent.
    """
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        return redact_record(previous(*args, **kwargs))

    logging.setLogRecordFactory(factory)
    _installed = True


def redact_exception(error: BaseException) -> BaseException:
    """Mask secrets in the text of ``error`` and of every exception in its cause/context chain, in place, so
    that a traceback printed from it (Rich's, Python's) shows no credential; returns ``error``."""
    for current in exception_chain(error):
        text = str(current)
        masked = redact_text(text)
        if masked != text:
            try:
                current.args = (masked,)
                if isinstance(getattr(current, "message", None), str):
                    current.message = masked
            except (AttributeError, TypeError):  # an exception type whose text cannot be replaced
                pass
    return error
