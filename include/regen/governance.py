"""What a run may choose: whoever may trigger a run may publish training data, so the deployment, not the run,
decides where prompts go and where answers land. A run's endpoints must be within `governance.allowed_endpoints`
and its storage root within `governance.allowed_storage_roots` (by default, the config's own); `plan` checks both
before anything is written or sent.

A storage root is checked as one parsed value (regen.storage.root.StorageRoot), the very value storage opens: no
spelling (`file://`, `S3://`, `..`, a link) can pass the check as one place and be opened as another.

An endpoint is an http(s) base URL: a query or fragment is refused, since `/generate` appended to `http://host/x?`
would become part of the query and reach another path on that host.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from regen.endpoints import Endpoint
from regen.errors import FinalError
from regen.storage import StorageRoot


class NotAllowed(FinalError):
    """A run chose an endpoint or a storage root outside the deployment's allowlists."""


def endpoint_address(url: str | Endpoint) -> str:
    """`host:port` of an SGLang base URL (the scheme's port when none is given), lowercase; ValueError saying what
    is wrong with a URL that is not a plain http(s) base URL (regen.endpoints: the URL shown redacted)."""
    return Endpoint.parse(url).address


def endpoint_allowed(url: str | Endpoint, patterns: list[str]) -> bool:
    """Whether the endpoint's `host:port` matches a pattern: `*` and `?` as in the shell (`sglang-*.internal:30000`,
    `10.0.0.*`), brackets literal (`[::1]:30000`), a pattern without a port allowing any port of its hosts."""
    address = endpoint_address(url)
    host = address.rsplit(":", 1)[0]
    for pattern in patterns:
        pattern = pattern.lower()
        with_port = re.search(r":[\d*?]+$", pattern) is not None
        literal_brackets = pattern.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")
        if fnmatch.fnmatchcase(address if with_port else host, literal_brackets):
            return True
    return False


def default_endpoint_patterns(endpoints: Sequence[str | Endpoint]) -> list[str]:
    """The config's own endpoints, exactly: their hosts and ports."""
    return [endpoint_address(url) for url in endpoints]


def check_endpoints(urls: Sequence[str | Endpoint], patterns: list[str]) -> None:
    outside = [str(Endpoint.parse(url)) for url in urls if not endpoint_allowed(url, patterns)]
    if outside:
        raise NotAllowed(
            f"endpoints {outside} are outside governance.allowed_endpoints {patterns}: a run may send prompts only "
            "to servers the deployment allows (add them to the config's governance.allowed_endpoints)"
        )


def storage_root_within(root: StorageRoot, allowed: StorageRoot) -> bool:
    """Whether `root` is `allowed` or below it, folder by folder (`s3://b/data2` is not within `s3://b/data`); both
    parsed (regen.storage.root), local ones resolved (`..` and links followed)."""
    return root.within(allowed)


def check_storage_root(root: StorageRoot, allowed: list[StorageRoot]) -> None:
    """The root that storage will open is within an allowed one; NotAllowed saying how to allow it."""
    if not any(root.within(prefix) for prefix in allowed):
        raise NotAllowed(
            f"storage_root {str(root)!r} is outside governance.allowed_storage_roots {[str(a) for a in allowed]}: a "
            "run may publish only where the deployment allows (add the root to the config's "
            "governance.allowed_storage_roots)"
        )
