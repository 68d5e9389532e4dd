"""An SGLang endpoint as the pipeline holds it, parsed once where a URL enters (the config, a run's params): its
base URL without credentials, and the user and password its URL may carry (`http://user:pass@host`, for a proxy in
front of the server) kept apart, never shown.

`str()`, `repr()` and the JSON form (config dumps, the run spec in XCom and in the run report) are the redacted URL
`http://***@host:port`. That form read back is an endpoint that needs a login and does not carry one: a task gets
the login at request time from the deployment's config or the run's params (regen.sglang.auth), so no secret
travels through XCom. Requests go to `base`, whose URL never carries a secret, so no message built from it can.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from pydantic import PlainSerializer, PlainValidator, SerializationInfo, WithJsonSchema

from regen.redaction import STAND_IN, redact_url, remember_login

__all__ = ["STAND_IN", "Endpoint", "EndpointUrl", "redact_url", "run_logins"]


class Endpoint:
    """`base`: scheme://host[:port][/path], no user, password or trailing slash. `login`: the URL's `user:password`
    as written (percent-encoded), or None; `needs_login`: the URL had one (or its stand-in `***`). Not a dataclass,
    so that nothing (`asdict`, pydantic's dump) turns it into a dict holding the login; equal by what it shows."""

    __slots__ = ("base", "login", "needs_login")
    base: str
    login: str | None
    needs_login: bool

    def __init__(self, base: str, login: str | None = None, needs_login: bool = False) -> None:
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "login", login)
        object.__setattr__(self, "needs_login", needs_login or login is not None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("an Endpoint is immutable")

    def __reduce__(self) -> tuple[Any, ...]:  # copies (pydantic's deep copies included) keep the login
        return (Endpoint, (self.base, self.login, self.needs_login))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Endpoint) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    @classmethod
    def parse(cls, url: str | Endpoint) -> Endpoint:
        """ValueError, with the URL redacted, saying what is wrong with one that is not a plain http(s) base URL: a
        query or fragment is refused, since `/generate` appended to `http://host/x?` would reach another path."""
        if isinstance(url, Endpoint):
            return url
        shown = redact_url(url)
        if any(c.isspace() for c in url):
            raise ValueError(f"endpoint {shown!r} contains whitespace")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"endpoint {shown!r} must start with http:// or https://")
        if parts.query or parts.fragment or "?" in url or "#" in url:
            raise ValueError(f"endpoint {shown!r} must be a base URL, without '?' or '#'")
        try:
            parts.port  # noqa: B018 (urlsplit checks the port when asked for it)
        except ValueError:
            raise ValueError(f"endpoint {shown!r} has a port that is not a number from 0 to 65535") from None
        userinfo, at, hostport = parts.netloc.rpartition("@")
        if not parts.hostname:
            raise ValueError(f"endpoint {shown!r} names no host")
        base = f"{parts.scheme}://{hostport}{parts.path}".rstrip("/")
        login = userinfo if at and userinfo != STAND_IN else None
        if login is not None:
            remember_login(login)  # scrubbed from every log line and alert from now on (regen.redaction)
        return cls(base, login, needs_login=bool(at))

    @property
    def address(self) -> str:
        """`host:port` (the scheme's port when none is given), lowercase; an IPv6 host in brackets."""
        parts = urlsplit(self.base)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def origin(self) -> str:
        """scheme://host:port: what a login is found by (a task's logins, regen.sglang.auth)."""
        return f"{urlsplit(self.base).scheme}://{self.address}"

    def basic_auth(self) -> tuple[str, str] | None:
        """The login's user and password, decoded, for an `Authorization: Basic` header; None without one."""
        if self.login is None:
            return None
        user, _, password = self.login.partition(":")
        return unquote(user), unquote(password)

    def __str__(self) -> str:
        if not self.needs_login:
            return self.base
        scheme, rest = self.base.split("://", 1)
        return f"{scheme}://{STAND_IN}@{rest}"

    def __repr__(self) -> str:
        return f"Endpoint({str(self)!r})"


def run_logins(configured: list[Endpoint], given: Any) -> list[Endpoint]:
    """The endpoints whose logins a task may use: the config's, and those a run's params give with a login (the
    params as the trigger form stored them; a value that is not a URL was refused at plan and is skipped here)."""
    typed = []
    for url in given if isinstance(given, list) else []:
        try:
            typed.append(Endpoint.parse(url))
        except (ValueError, TypeError):
            continue
    return [e for e in (*configured, *typed) if e.login is not None]


def _parse(value: Any) -> Endpoint:
    if not isinstance(value, str | Endpoint):
        raise ValueError("an endpoint is a URL string")
    return Endpoint.parse(value)


def _dump(endpoint: Endpoint, info: SerializationInfo) -> Any:
    return str(endpoint) if info.mode_is_json() else endpoint


EndpointUrl = Annotated[
    Endpoint,
    PlainValidator(_parse),
    PlainSerializer(_dump),
    WithJsonSchema({"type": "string", "format": "uri"}),
]
"""A pydantic field of one endpoint: given as a URL string, dumped redacted (in Python, the Endpoint itself, whose
repr is redacted too)."""
