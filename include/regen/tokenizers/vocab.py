"""What a vocabulary entry stands for, in bytes: shared by the tokenizer builders, the byte-table decoder and the
bound on text one token can cover."""

from __future__ import annotations


def entry_bytes(token: str, byte_of: dict[str, int], added: bool = False) -> bytes:
    """The bytes a vocabulary entry stands for: in a byte-level vocabulary each character of a learnt entry is one byte
    (`bytes_to_unicode`); an added token, or an entry outside that alphabet, is its own UTF-8 text."""
    if added or any(c not in byte_of for c in token):
        return token.encode("utf-8", "surrogatepass")
    return bytes(byte_of[c] for c in token)
