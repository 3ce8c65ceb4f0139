"""One redaction function for everything halluscope records: argv, URLs, LM descriptions, error text, reports,
manifests, summaries and MLflow params.

What is replaced by ``***``:

* every value registered with :func:`register_secret` (``halluscope.lm.models.make_lm`` registers the ``api_key`` it is
  given, so ``--api-key KEY`` never reaches a file);
* the value of any environment variable whose name says key/token/secret/password/credential (8+ characters);
* credentials inside URLs: ``scheme://user:pass@host`` -> ``scheme://***@host``, and query parameters such as
  ``?api_key=...``, ``&token=...``, ``&key=...``;
* strings shaped like well-known API keys (``sk-...``, ``hf_...``, ``AKIA...``, ``ghp_...``, ...);
* ``api_key=...`` / ``"token": "..."`` style assignments inside text;
* in an argv list, the value after ``--api-key``/``--*-key``/``--*-token`` (or after ``=``).

:func:`redact_obj` applies the same to every string (and every value under a secret-named key) of a JSON-like
structure, so a report or manifest can be redacted before it is written.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Iterable, Sequence

__all__ = ["REDACTED", "register_secret", "redact", "redact_url", "redact_obj", "redact_argv", "is_secret_name",
           "known_secrets"]

REDACTED = "***"

_SECRET_NAME = re.compile(r"(api[_-]?key|apikey|token|secret|passw(or)?d|authorization|credential)", re.I)
# A field or option whose *whole name* ends in a secret word (``api_key``, ``hf_token``, ``--api-key``), unlike
# ``max_tokens`` or ``lm_input_tokens``, which are counts.
_SECRET_FIELD = re.compile(r"(?i)(?:^|[_\-])(?:api[_\-]?key|apikey|key|token|access[_\-]?token|secret|passw(?:or)?d|"
                           r"authorization|credentials?)$")
_SECRET_VALUE = re.compile(
    r"(sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}"  # OpenAI / Anthropic
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|AIza[0-9A-Za-z_\-]{30,}"  # Google
    r"|gsk_[A-Za-z0-9]{20,})"  # Groq
)
# ``api_key=VALUE``, ``"token": "VALUE"``: a value right after ``=`` (``api_key= on dspy.LM`` is prose) with a letter
# or digit in it (``api_key="..."``, ``OPENAI_API_KEY=...`` are placeholders in a hint, kept as written)
_SECRET_ASSIGN = re.compile(
    r"""(["']?(?:api[_-]?key|apikey|token|secret|password|authorization)["']?(?:\s*:\s*|=)["']?)"""
    r"""((?=[^"',\s}&]*[A-Za-z0-9])[^"',\s}&]+)""", re.I)
# scheme://user:pass@host or scheme://token@host
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/@\s\"'<>]+)@")
# ?api_key=..., &key=..., &token=..., &access_token=..., &sig=..., &password=...
_URL_QUERY = re.compile(
    r"(?i)([?&;](?:api[_-]?key|apikey|key|token|access[_-]?token|auth|secret|password|passwd|sig|signature|"
    r"client[_-]?secret)=)([^&#\s\"'<>]+)")

_lock = threading.Lock()
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember ``value`` (an API key given on the command line or in code) so every later :func:`redact` hides
    it. Values shorter than 4 characters, and placeholders such as ``not-needed``, are not registered."""
    if not isinstance(value, str) or len(value) < 4 or value.lower() in ("not-needed", "none", "true", "false"):
        return
    with _lock:
        _registered.add(value)


def is_secret_name(name: str) -> bool:
    """True for a field or option name ending in key/token/secret/password/credential (``api_key``,
    ``--hf-token``; not ``max_tokens``)."""
    return bool(_SECRET_FIELD.search(str(name).lstrip("-")))


def known_secrets() -> list[str]:
    """The literal secrets :func:`redact` hides: registered ones and secret-named environment variables."""
    out = []
    for k, v in os.environ.items():
        if v and len(v) >= 8 and _SECRET_NAME.search(k) and v.lower() not in ("true", "false", "not-needed"):
            out.append(v)
    with _lock:
        out.extend(_registered)
    return sorted(set(out), key=len, reverse=True)  # longest first: a secret containing another is hidden whole


def redact_url(url: str) -> str:
    """``url`` without credentials: userinfo and secret query parameters become ``***``."""
    s = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", str(url))
    return _URL_QUERY.sub(lambda m: m.group(1) + REDACTED, s)


def redact(value: Any, extra_secrets: Sequence[str] = ()) -> str:
    """``value`` as a string (JSON for non-strings) with anything secret replaced by ``***``."""
    s = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    for secret in (*extra_secrets, *known_secrets()):
        if secret and len(secret) >= 4:
            s = s.replace(secret, REDACTED)
    s = redact_url(s)
    s = _SECRET_VALUE.sub(REDACTED, s)
    s = _SECRET_ASSIGN.sub(lambda m: m.group(1) + REDACTED, s)
    return s


def redact_obj(obj: Any, extra_secrets: Sequence[str] = ()) -> Any:
    """A copy of a JSON-like ``obj`` with every string redacted and every non-empty string under a secret-named
    key (:func:`is_secret_name`) replaced by ``***``; numbers, booleans and None are kept."""
    if isinstance(obj, str):
        return redact(obj, extra_secrets)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v:
                out[k] = REDACTED
            else:
                out[k] = redact_obj(v, extra_secrets)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v, extra_secrets) for v in obj]
    return obj


def redact_argv(argv: Iterable[str] | None) -> list[str] | None:
    """A command line with the value of every secret-named option (``--api-key KEY``, ``--api-key=KEY``,
    ``--hf-token X``) replaced, and every other argument passed through :func:`redact`."""
    if argv is None:
        return None
    out: list[str] = []
    hide_next = False
    for a in argv:
        a = str(a)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if a.startswith("--") and is_secret_name(a.split("=", 1)[0]):
            if "=" in a:
                out.append(a.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(redact(a))
    return out


def error_text(e: BaseException, limit: int = 300) -> str:
    """One line naming an exception for a report: ``"<Type>: <message>"``, the message's lines joined (a library's
    "To fix:" hint under its message included) and cut to ``limit`` characters at a word, ``…`` marking the cut."""
    message = " ".join(str(e).split())
    if len(message) > limit:
        cut = message[: limit - 1]
        message = (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut) + "…"
    return f"{type(e).__name__}: {message}"
