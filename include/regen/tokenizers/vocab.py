"""What a vocabulary entry stands for, in bytes: shared by the tokenizer builders, the byte-table decoder and the
bound on text one token can cover."""

from __future__ import annotations

from functools import cache


def entry_bytes(token: str, added: bool = False) -> bytes:
    """The bytes a vocabulary entry stands for: in a byte-level vocabulary each character of a learnt entry is one byte
    (`bytes_to_unicode`); an added token, or an entry outside that alphabet, is its own UTF-8 text.

    One `str.translate` per entry, not a dict lookup per character: a renderer reads its whole vocabulary (160k
    entries for Kimi) when it is built, in every tokenizer worker. The table sends each character of the alphabet to
    the Latin-1 character of its byte and every other character below 256 above it, so `encode("latin-1")` gives
    the entry's bytes, and fails exactly when some character is outside the alphabet."""
    if added:
        return token.encode("utf-8", "surrogatepass")
    try:
        return token.translate(_byte_level_table()).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8", "surrogatepass")


@cache
def _byte_level_table() -> dict[int, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    outside = 0x100  # any code point above Latin-1: encode("latin-1") refuses it
    table = {code: outside for code in range(0x100)}
    table.update({ord(char): byte for byte, char in bytes_to_unicode().items()})
    return table
