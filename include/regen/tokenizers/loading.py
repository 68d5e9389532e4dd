"""Loading a profile's tokenizer: a built-in one from the registry, a local directory, or a hub id at a pinned
revision (with the shim that lets remote code written for transformers 4 load under 5), and what to fix when it
does not load; and the fingerprint of the files it was loaded from, which every manifest records."""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path
from typing import Any

from regen.tokenizers import BUILTIN

TOKENIZER_FILE = re.compile(
    r"^(tokenizer.*\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt|"
    r"tiktoken\.model|.*\.tiktoken|chat_template\.(jinja|json)|tokenization_.*\.py|tool_declaration.*\.py)$"
)


def tokenizer_files_digest(source: str, revision: str | None = None) -> dict[str, str]:
    """File name -> sha256 of every tokenizer file in the directory the tokenizer was loaded from (for a hub id,
    its snapshot in the local cache, which loading it just filled)."""
    directory = Path(source)
    if not directory.is_dir():
        from huggingface_hub import snapshot_download

        try:
            directory = Path(snapshot_download(source, revision=revision, local_files_only=True))
        except (OSError, ValueError):  # not in the local cache: nothing on disk to fingerprint
            return {}
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
        if path.is_file() and TOKENIZER_FILE.match(path.name)
    }


@cache
def load_tokenizer(source: str, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """A built-in tokenizer (`builtin:<name>`, from the registry in regen.tokenizers), a local directory or a hub id at
    a pinned revision. Loaded once per process: loaded tokenizers are shared, never changed."""
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN:
            raise ValueError(f"unknown builtin tokenizer {source!r}; built in: {', '.join(sorted(BUILTIN))}")
        return BUILTIN[name]()
    from transformers import AutoTokenizer

    if trust_remote_code:
        restore_transformers4_imports()
    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)


def why_tokenizer_fails(where: str, error: BaseException) -> str:
    """What to fix when a tokenizer (`where`: which, for whom) does not load: the missing module and what to install,
    the import that broke and which transformers the code needs, or the files that are not there."""
    import transformers

    if isinstance(error, ModuleNotFoundError) and error.name:
        top = error.name.split(".")[0]
        return (
            f"{where} does not load: its code imports the module {error.name!r}, which is not installed. Install it "
            f"(pip install {top}) or, if it is part of transformers, use a transformers release that has it "
            f"(installed: {transformers.__version__})"
        )
    if isinstance(error, ImportError):
        return (
            f"{where} does not load: an import in its code failed ({error}). Its code was written for another "
            f"transformers release (installed: {transformers.__version__}): pin the one it was written for"
        )
    if isinstance(error, OSError):
        return f"{where} does not load: its files cannot be found or read ({error})"
    return f"{where} does not load: {error!r}"


def restore_transformers4_imports() -> None:
    """Remote tokenizer code written against transformers 4, Kimi-K2.5's `tokenization_kimi.py` among it, imports
    `bytes_to_unicode` from `transformers.models.gpt2.tokenization_gpt2`. transformers 5 moved it to
    `transformers.convert_slow_tokenizer` (the same function), so that import fails at load. Put the name back where
    the published code looks for it; nothing else is changed. Tested with the pinned transformers (5.24)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.gpt2 import tokenization_gpt2

    if not hasattr(tokenization_gpt2, "bytes_to_unicode"):
        tokenization_gpt2.bytes_to_unicode = bytes_to_unicode  # type: ignore[attr-defined]
