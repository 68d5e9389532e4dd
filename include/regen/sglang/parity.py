"""The SGLang release this pipeline's token fidelity is proven against.

PROVEN_SGLANG_VERSION is the version whose chat layer (how it shapes a chat request into the template's input, and
its reasoning and tool-call parsers) the renderer (regen.chat) and the answer reader (regen.on_policy) are proven
equal to, by the differential tests in tests/parity/. docker-compose.yaml pins the same release's
image (a unit test keeps the two equal), and the run report warns when the fleet serves another version, or does not
say which.
"""

from __future__ import annotations

from typing import Any

PROVEN_SGLANG_VERSION = "0.5.23"


def sglang_version_warnings(fleet: list[dict[str, Any]]) -> list[str]:
    """One warning per SGLang version other than PROVEN_SGLANG_VERSION among the servers of the fleet check
    (regen.sglang.server_check: every endpoint, or each worker behind a router), and one for the servers whose version
    is unknown (a server, or a router's worker, whose server info does not say or cannot be reached from here). The
    renderer and the answer reader are proven equal to that release's chat layer only. An empty fleet (no check
    passed, nothing was served) warns of nothing."""
    servers: dict[str | None, list[str]] = {}
    for endpoint in fleet:
        workers = endpoint.get("workers") or []
        for url, version in (
            [(f"{endpoint['url']} (worker {w['url']})", w.get("version")) for w in workers]
            if workers
            else [(endpoint["url"], endpoint.get("version"))]
        ):
            servers.setdefault(str(version) if version else None, []).append(url)
    proven = f"prompts and answers are proven equal to SGLang {PROVEN_SGLANG_VERSION}'s chat layer only"
    warnings = [
        f"SGLang {version} serves this run ({', '.join(urls)}); {proven}"
        for version, urls in sorted((v, u) for v, u in servers.items() if v is not None and v != PROVEN_SGLANG_VERSION)
    ]
    if None in servers:
        warnings.append(
            f"SGLang of unknown version serves this run ({', '.join(servers[None])}: no version in the server info "
            f"read from here); {proven}"
        )
    return warnings
