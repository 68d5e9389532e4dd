"""The SGLang release this pipeline's token fidelity is proven against.

PROVEN_SGLANG_VERSION is the version whose chat layer (how it shapes a chat request into the template's input, and
its reasoning and tool-call parsers) the renderer (regen.chat) and the answer reader (regen.on_policy) are proven
equal to, by the differential tests in tests/parity/ (being written now). docker-compose.yaml pins the same release's
image (a unit test keeps the two equal), and the run report warns when the fleet serves another version, or does not
say which.
"""

from __future__ import annotations

PROVEN_SGLANG_VERSION = "0.5.23"
