"""Secrets out of every text the pipeline shows: log lines, exception messages, alert mail.

Messages are built redacted where they are made (an endpoint URL through `redact_url`, a foreign exception through
`describe`, never its repr: aiohttp's carries the request's headers, `Authorization` included). And where messages
leave the process, `redact` scrubs them once more: the `RedactSecrets` log filter (`install_log_redaction` puts it on
the root logger's handlers, where a task's log lines and the CLI's go) and the alert formatter
(regen_airflow.alerts). It scrubs, whatever the text:
- userinfo: `user:password@` with any scheme or none (`http://`, `http:/`, `http:`, bare `user:pw@host`), and
  anything between `://` and an `@`;
- `Authorization` header values, `Basic ...` and `Bearer ...` tokens;
- the secrets this process knows (`remember`): every login an endpoint URL carried (regen.endpoints) and every API
  key (regen.sglang.auth), as given, percent-decoded and as their `Basic` header value. One shorter than
  `MIN_KNOWN` characters is scrubbed only in the forms above, or every log line would lose its short words.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from urllib.parse import unquote

STAND_IN = "***"  # what a secret is shown as
MIN_KNOWN = 4

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/+")  # kept in front of a URL's redacted userinfo
_AFTER_SCHEME = re.compile(r"://[^\s'\"<>]*@")
# user (no `/`, `:` or `@`), `:`, password (not starting with `/`, so `http://` is no user `http`), `@`
_USERINFO = re.compile(r"[^\s'\"<>/@:]+:(?!/)[^\s'\"<>@]*@")
_HEADER = re.compile(r"(Authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\r\n,}]+", re.IGNORECASE)
_TOKEN = re.compile(r"\b(Basic|Bearer) +[A-Za-z0-9._~+/=-]{3,}")

_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def remember(*secrets: str | None) -> None:
    """Secrets every later `redact` scrubs wherever they appear: as given and percent-decoded."""
    global _known_pattern
    given = [s for s in secrets if isinstance(s, str)]
    new = {form for s in given for form in (s, unquote(s)) if len(form) >= MIN_KNOWN} - _known
    if new:
        with _lock:
            _known.update(new)
            ordered = sorted(_known, key=len, reverse=True)  # a secret inside a longer one: the longer first
            _known_pattern = re.compile("|".join(map(re.escape, ordered)))


def known_secrets() -> frozenset[str]:
    """What `remember` was given (for a logging system with its own masker: Airflow's)."""
    return frozenset(_known)


def remember_login(login: str) -> None:
    """A URL's `user:password` (percent-encoded as written): the password, the pair, and the pair as the
    `Authorization: Basic` value it is sent as. The user alone is no secret (and too often a common word)."""
    user, _, password = login.partition(":")
    basic = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    remember(password, login, basic)


def redact(text: str) -> str:
    """The text with every secret it shows as `***` (the module's docstring says which)."""
    if _known_pattern is not None:
        text = _known_pattern.sub(STAND_IN, text)
    text = _AFTER_SCHEME.sub(f"://{STAND_IN}@", text)
    text = _USERINFO.sub(f"{STAND_IN}@", text)
    text = _HEADER.sub(rf"\g<1>{STAND_IN}", text)
    return _TOKEN.sub(rf"\g<1> {STAND_IN}", text)


def redact_url(url: str) -> str:
    """A URL string as it may be shown: everything before its last `@` becomes `***`, after the scheme and its
    slashes where it has them (`http://***@host`, `http:/***@host`, `***@host`), whether or not the URL is well
    formed: an error about a malformed URL must not show the password in it either."""
    head, at, rest = url.rpartition("@")
    if not at:
        return redact(url)
    scheme = _SCHEME.match(head)
    return redact(f"{scheme.group() if scheme else ''}{STAND_IN}@{rest}")


def describe(error: BaseException) -> str:
    """A foreign exception as a message may quote it: its type and its text, redacted. Never its repr: aiohttp's
    `ClientResponseError` repr carries the request's headers (`Authorization: Basic ...`, `Bearer ...`)."""
    text = redact(str(error))
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class RedactSecrets(logging.Filter):
    """Formats a record's message once, redacted (its arguments dropped, so no handler formats them again), and
    redacts its traceback and stack text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):  # arguments that do not fit the format: shown without them
            message = f"{record.msg} (unformattable arguments)"
        record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


PROJECT_LOGGERS = ("", "regen", "regen_airflow")  # the root's handlers get every record that propagates


def install_log_redaction(*extra: logging.Logger) -> None:
    """`RedactSecrets` on every handler of the root logger, the project's loggers and `extra` ones (once each):
    called where logging is configured (the CLI) and where a task starts (regen_airflow.tasks), after Airflow has
    set up the task log's handlers."""
    for logger in (*map(logging.getLogger, PROJECT_LOGGERS), *extra):
        for handler in logger.handlers:
            if not any(isinstance(f, RedactSecrets) for f in handler.filters):
                handler.addFilter(RedactSecrets())
