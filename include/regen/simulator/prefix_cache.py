"""SGLang's radix cache as a client sees it: `meta_info.cached_tokens`, the part of a prompt an earlier request left
in the server's KV cache, which the server does not prefill again. What multi-turn and shared system prompts save,
and what the report's cost accounting reads.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

PAGE = 16  # tokens per cached page: a prefix is cached in whole pages


class PrefixCache:
    """Prefixes of earlier prompts, page by page, least recently used evicted first once `capacity_tokens` are held.
    The last token of a prompt is always computed (a server must run it to sample the first output token), so a
    prompt seen before whole still has less than its length cached."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = max(1, capacity_tokens // PAGE)
        self.pages: OrderedDict[bytes, None] = OrderedDict()

    def admit(self, prompt_ids: list[int]) -> int:
        """The prompt's cached tokens; its own pages are cached from now on."""
        digest = hashlib.blake2b(digest_size=16)
        cached, matching = 0, True
        for end in range(PAGE, len(prompt_ids), PAGE):  # whole pages before the last token
            digest.update(array("q", prompt_ids[end - PAGE : end]).tobytes())
            key = digest.digest()  # the prefix up to here: a page is only ever reused after the same prefix
            if key in self.pages:
                self.pages.move_to_end(key)
                cached = end if matching else cached
            else:
                matching = False
                self.pages[key] = None
        while len(self.pages) > self.capacity:
            self.pages.popitem(last=False)
        return cached
