"""Run in the SGLang environment (it has torch; tools/sglang_env.sh): the trainers' own code over a published
version's train split, read as they read it, with Hugging Face `datasets`. vLLM speculators 0.9.0 counts
(`save_token_frequency_distribution`) and maps (`build_vocab_mappings_from_distribution`); SpecForge 0.2.0 counts and
maps in one (`generate_vocab_mapping_file`). Each result is written as .npy files for tests/parity/
test_trainers_vocab.py to compare with the version's own vocab/ files; and the version's SpecForge mapping file
(regen's, made from its .npy pair) is loaded as SpecForge's trainer loads one.

Usage: python trainers_oracle.py OUT TARGET_VOCAB DRAFT_SIZE,... VERSION_VOCAB_DIR TRAIN_PARQUET...
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import load_dataset


def speculators_vocab_mapping() -> Any:
    """speculators/train/vocab_mapping.py, loaded as a file: the package's __init__ imports its whole model zoo and
    hs-connectors, none of which this code needs."""
    package = importlib.util.find_spec("speculators")
    assert package is not None and package.submodule_search_locations, "speculators is not installed"
    path = Path(next(iter(package.submodule_search_locations))) / "train" / "vocab_mapping.py"
    spec = importlib.util.spec_from_file_location("speculators_vocab_mapping", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    out, target, sizes, vocab_dir, *train = sys.argv[1:]
    out_dir = Path(out)
    dataset = load_dataset("parquet", data_files={"train": train}, split="train").with_format("torch")

    speculators = speculators_vocab_mapping()
    freq_path = out_dir / "speculators_token_freq.pt"
    speculators.save_token_frequency_distribution(dataset, freq_path)
    freq = torch.load(freq_path, weights_only=True)
    (out_dir / "speculators_token_freq.json").write_text(json.dumps({str(k): int(v) for k, v in freq.items()}))
    from specforge.data.preprocessing import generate_vocab_mapping_file

    for size in map(int, sizes.split(",")):
        d2t, t2d = speculators.build_vocab_mappings_from_distribution(freq, size, int(target))
        np.save(out_dir / f"speculators_d2t_{size}.npy", d2t.numpy())
        np.save(out_dir / f"speculators_t2d_{size}.npy", t2d.numpy())
        path = generate_vocab_mapping_file(dataset, int(target), size, str(out_dir), f"specforge-{size}")
        mapping = torch.load(path, weights_only=True)
        np.save(out_dir / f"specforge_d2t_{size}.npy", mapping["d2t"].numpy())
        np.save(out_dir / f"specforge_t2d_{size}.npy", mapping["t2d"].numpy())

    from regen.vocab import specforge_mapping  # the version's .npy pair, as the training hand-off converts it

    pair = [np.load(Path(vocab_dir) / f"{name}.npy") for name in ("d2t", "t2d")]
    (out_dir / "ours.pt").write_bytes(specforge_mapping(*pair))
    ours = torch.load(out_dir / "ours.pt", weights_only=True)  # as SpecForge's trainer loads its mapping file
    np.save(out_dir / "ours_pt_d2t.npy", ours["d2t"].numpy())
    np.save(out_dir / "ours_pt_t2d.npy", ours["t2d"].numpy())
    (out_dir / "done.json").write_text(json.dumps({"rows": len(dataset), "pt_keys": sorted(ours)}))


if __name__ == "__main__":
    main()
