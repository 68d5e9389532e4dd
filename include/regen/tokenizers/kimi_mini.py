"""A small tokenizer with Kimi-K2.5's token layout, built deterministically on this machine.

Same vocabulary size (163,840), same special-token strings at the same ids, byte-level BPE so that any text
round-trips, and a chat template that renders the same text as Kimi-K2.5's (with the TypeScript tool declaration of
tool_declaration_ts.py, passed by the tokenizer class in fast_kimi.py). Only the BPE merges differ: they are learnt
from a small corpus shipped with the project, so tokens are shorter than the real model's, which no test depends on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

log = logging.getLogger(__name__)

BPE_RANKS = 163_584
VOCAB_SIZE = 163_840
LEARNT_VOCAB = 4_096  # the corpus is small; merges stop earlier if it runs out of pairs

# Kimi's pre-tokenization: Han runs apart, words with their leading punctuation, digits in threes.
SPLIT_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

NAMED_SPECIAL_TOKENS: dict[int, str] = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163590: "<|start_header_id|>",
    163591: "<|end_header_id|>",
    163593: "[EOT]",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163602: "<|media_begin|>",
    163603: "<|media_content|>",
    163604: "<|media_end|>",
    163605: "<|media_pad|>",
    163606: "<think>",
    163607: "</think>",
    163838: "[UNK]",
    163839: "[PAD]",
}
# Tokens the model writes as content: skip_special_tokens must keep them in the decoded text.
NON_SPECIAL = frozenset(
    {
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<think>",
        "</think>",
    }
)


TOOL_DECLARATION = "tool_declaration_ts.py"
# Every file a build reads or copies: the cache directory's name is their digest.
BUILD_INPUTS = ("kimi_mini.py", "corpus.txt", "kimi_k25_chat_template.jinja", TOOL_DECLARATION)

# The settings both the fast mini tokenizer and its slow twin (slow_kimi.py) are saved with.
TOKENIZER_SETTINGS: dict[str, object] = {
    "bos_token": "[BOS]",
    "eos_token": "[EOS]",
    "unk_token": "[UNK]",
    "pad_token": "[PAD]",
    "model_max_length": 262_144,
    "clean_up_tokenization_spaces": False,
}


def special_token_table() -> list[tuple[int, str]]:
    """All 256 reserved slots in id order; unnamed slots get a reserved name, as in the real tokenizer."""
    return [
        (token_id, NAMED_SPECIAL_TOKENS.get(token_id, f"<|reserved_token_{token_id - BPE_RANKS}|>"))
        for token_id in range(BPE_RANKS, VOCAB_SIZE)
    ]


def _corpus() -> list[str]:
    text = resources.files("regen.tokenizers").joinpath("corpus.txt").read_text(encoding="utf-8")
    return text.splitlines(keepends=True)


def chat_template() -> str:
    return resources.files("regen.tokenizers").joinpath("kimi_k25_chat_template.jinja").read_text(encoding="utf-8")


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _learn_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNT_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    learner.train_from_iterator(_corpus(), trainer)
    model = json.loads(learner.to_str())["model"]
    merges = [(m.split(" ", 1)[0], m.split(" ", 1)[1]) if isinstance(m, str) else (m[0], m[1]) for m in model["merges"]]
    return dict(model["vocab"]), merges


def build_tokenizer_object() -> Tokenizer:
    """The `tokenizers` object: learnt BPE padded to Kimi's 163,584 ranks, then the 256 special slots."""
    vocab, merges = _learn_bpe()
    # Padding ranks are never produced (no merge builds them) but keep every id of the real layout valid.
    for rank in range(len(vocab), BPE_RANKS):
        filler = f"<|unused_rank_{rank}|>"
        if filler in vocab:
            raise RuntimeError(f"padding token {filler!r} collides with a learnt token")
        vocab[filler] = rank
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    for token_id, content in special_token_table():
        if content in NON_SPECIAL:
            tokenizer.add_tokens([AddedToken(content, special=False, normalized=False)])
        else:
            tokenizer.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        if tokenizer.token_to_id(content) != token_id:
            raise RuntimeError(f"{content!r} landed at id {tokenizer.token_to_id(content)}, expected {token_id}")
    return tokenizer


def copy_tool_declaration(directory: Path) -> None:
    """The TypeScript tool encoder beside the tokenizer files, under the name Kimi's repository gives it: the slow twin
    imports it from there, and a run's tokenizer-file digests (`regen.chat.tokenizer_files_digest`) then change
    whenever the encoder, and so a prompt with tools, does."""
    source = resources.files("regen.tokenizers").joinpath(TOOL_DECLARATION)
    (directory / TOOL_DECLARATION).write_bytes(source.read_bytes())


def save_pretrained(directory: Path) -> None:
    """Write a directory that `fast_kimi.load_mini_tokenizer` loads offline (plain `AutoTokenizer` loads the same
    tokens and template but, like Kimi's without its remote code, declares tools as JSON)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer_object(), **TOKENIZER_SETTINGS)
    fast.chat_template = chat_template()
    fast.save_pretrained(str(directory))
    copy_tool_declaration(directory)


def _source_digest() -> str:
    """Changes whenever anything the build depends on changes, so a stale cache is never used."""
    digest = hashlib.sha256()
    for name in BUILD_INPUTS:
        digest.update(resources.files("regen.tokenizers").joinpath(name).read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eagle3-regen"
    return Path(os.environ.get("REGEN_ASSET_CACHE", default))


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """Build a cache directory on first use; concurrent builders race harmlessly through an atomic rename."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        build(staging)
        os.replace(staging, target)
        log.info("built %s", target)
    except OSError:
        if not (target / marker).exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_mini_tokenizer() -> Path:
    return build_once(cache_root() / f"kimi-k2.5-mini-{_source_digest()}", "tokenizer.json", save_pretrained)


# Kimi-K2.5's remote-code layout (tiktoken_kimi.py says why it is built): the module's name in Kimi's repository.
TIKTOKEN_MODULE, TIKTOKEN_CLASS = "tokenization_kimi", "TikTokenTokenizer"


def write_tiktoken_directory(target: Path) -> None:
    """Kimi's layout over the mini vocabulary: tiktoken.model (base64 token bytes and rank, in rank order),
    tokenizer_config.json (auto_map, the special tokens), chat_template.jinja, and the two Python modules."""
    import base64

    from regen.tokenizers.vocab import entry_bytes

    fast = json.loads((ensure_mini_tokenizer() / "tokenizer.json").read_text(encoding="utf-8"))
    lines = []
    for token, rank in sorted(fast["model"]["vocab"].items(), key=lambda item: item[1]):
        lines.append(f"{base64.b64encode(entry_bytes(token)).decode()} {rank}\n")
    (target / "tiktoken.model").write_text("".join(lines), encoding="ascii")
    flags = {"lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
    added = {
        str(t["id"]): {"content": t["content"], "special": t["content"] not in NON_SPECIAL, **flags}
        for t in fast["added_tokens"]
    }
    config = {
        **TOKENIZER_SETTINGS,
        "tokenizer_class": TIKTOKEN_CLASS,
        "auto_map": {"AutoTokenizer": [f"{TIKTOKEN_MODULE}.{TIKTOKEN_CLASS}", None]},
        "added_tokens_decoder": added,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")
    (target / "chat_template.jinja").write_text(chat_template(), encoding="utf-8")
    remote = resources.files("regen.tokenizers").joinpath("tiktoken_kimi.py")
    (target / f"{TIKTOKEN_MODULE}.py").write_bytes(remote.read_bytes())
    copy_tool_declaration(target)


def ensure_tiktoken_tokenizer() -> Path:
    """A directory with Kimi-K2.5's tokenizer layout that `AutoTokenizer.from_pretrained(path,
    trust_remote_code=True)` loads (with tiktoken installed); built once into the asset cache."""
    remote = resources.files("regen.tokenizers").joinpath("tiktoken_kimi.py").read_bytes()
    digest = hashlib.sha256(remote + ensure_mini_tokenizer().name.encode()).hexdigest()[:12]
    return build_once(
        cache_root() / f"kimi-k2.5-mini-tiktoken-{digest}", "tokenizer_config.json", write_tiktoken_directory
    )
