"""The trainers' own code agrees with a published version's vocab/ files: vLLM speculators 0.9.0 and SpecForge 0.2.0,
installed from the package index into the SGLang environment (it has torch), count the version's train split as they
read it (Hugging Face `datasets`) and map its draft vocabulary (tests/parity/trainers_oracle.py). Their counts must be
vocab/token_freq.parquet and their d2t/t2d vocab/d2t.npy and t2d.npy, element by element, dtype too.

Besides the profile's size (32,000: fewer ids seen, so padded), two sizes that cut the ranking: one where ids tie at
the cut, where speculators (the lower id first, this project's rule) and SpecForge (the id seen first) may differ,
and one where none tie, where all three agree. vocab/specforge.pt, made from the .npy pair, loads as SpecForge's
trainer loads its own mapping file, equal to it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from regen import pipeline
from regen.vocab import counts_from_table, vocab_mapping
from tests.conftest import ROOT, Simulator, each_shard
from tests.parity.oracle import oracle_python

TARGET = 163_840


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory, simulator: Simulator) -> Path:
    """B1 answered at two temperatures, published through the pipeline's tasks: its version folder."""
    home = tmp_path_factory.mktemp("trainers")
    source = home / "B1.jsonl"
    shutil.copy(ROOT / "data" / "samples" / "B1_glaive.jsonl", source)
    config = {
        "defaults": {"storage_root": str(home / "storage"), "shard_size": 9, "tokenize_workers": 1},
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "datasets": {"B1": {"format": "openai_messages", "paths": [str(source)], "temperatures": [0.5, 1.0]}},
    }
    (home / "regen.yaml").write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("REGEN_CONFIG", str(home / "regen.yaml"))
        run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url]}, "v1"))
        [prepared] = pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, "B1")])
        for shard in each_shard(run, [prepared]):
            pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
        published = pipeline.publish_dataset(run, prepared, [], pipeline.verify_dataset(run, prepared))
    return Path(published["manifest"]).parent


def cut_sizes(counts: np.ndarray) -> tuple[int, int]:
    """A draft size whose cut falls between two equal counts, and one whose cut falls between unequal ones."""
    ranked = np.sort(counts[counts > 0])[::-1]
    tied = next(d for d in range(2, len(ranked)) if ranked[d - 1] == ranked[d])
    clean = next(d for d in range(2, len(ranked)) if ranked[d - 1] > ranked[d])
    return tied, clean


def test_speculators_and_specforge_count_and_map_as_the_version_does(version: Path, tmp_path: Path) -> None:
    manifest = json.loads((version / "manifest.json").read_text())
    root = Path(manifest["root"])
    train = sorted(str(root / k) for k in manifest["files"] if "/train/" in k and k.endswith(".parquet"))
    counts = counts_from_table(pq.read_table(version / "vocab" / "token_freq.parquet"), TARGET)
    tied, clean = cut_sizes(counts)
    sizes = [manifest["vocab"]["draft_vocab_size"], tied, clean]
    assert sizes[0] == 32_000 and np.count_nonzero(counts) < sizes[0]  # the padded case
    script = Path(__file__).with_name("trainers_oracle.py")
    arguments = [str(tmp_path), str(TARGET), ",".join(map(str, sizes)), str(version / "vocab"), *train]
    done = subprocess.run(
        [str(oracle_python()), str(script), *arguments],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "include"), "CUDA_VISIBLE_DEVICES": "", "HF_DATASETS_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    oracle = json.loads((tmp_path / "done.json").read_text())
    assert oracle["rows"] == manifest["splits"]["train"] and oracle["pt_keys"] == ["d2t", "t2d"]

    counted = json.loads((tmp_path / "speculators_token_freq.json").read_text())
    assert {int(k): v for k, v in counted.items()} == {int(i): int(counts[i]) for i in np.flatnonzero(counts)}

    def same(found: str, expected: np.ndarray) -> bool:
        array = np.load(tmp_path / found)
        return array.dtype == expected.dtype and np.array_equal(array, expected)

    published = {name: np.load(version / "vocab" / f"{name}.npy") for name in ("d2t", "t2d")}
    for size in sizes:
        d2t, t2d = vocab_mapping(counts, size, TARGET)
        if size == sizes[0]:
            assert np.array_equal(d2t, published["d2t"]) and np.array_equal(t2d, published["t2d"])
        assert same(f"speculators_d2t_{size}.npy", d2t) and same(f"speculators_t2d_{size}.npy", t2d), size
        if size != tied:  # SpecForge keeps the id it saw first of those tied at the cut
            assert same(f"specforge_d2t_{size}.npy", d2t) and same(f"specforge_t2d_{size}.npy", t2d), size
    # The version's SpecForge file, made from its .npy pair, is SpecForge's own for the profile's size.
    assert same("ours_pt_d2t.npy", published["d2t"]) and same("ours_pt_t2d.npy", published["t2d"])
    assert same("specforge_d2t_32000.npy", published["d2t"])


def test_the_docs_one_line_conversion_makes_the_file_specforge_loads(version: Path, tmp_path: Path) -> None:
    """docs/data.md's line for a machine without the hand-off's torch, run as written (with the oracle's python)."""
    text = (ROOT / "docs" / "data.md").read_text(encoding="utf-8")
    [line] = [block for block in text.split("```bash\n")[1:] if "specforge.pt" in block.split("```")[0]]
    command = line.split("```")[0].strip()
    assert command.startswith("python -c ")
    shutil.copytree(version / "vocab", tmp_path / "vocab")
    (tmp_path / "vocab" / "specforge.pt").unlink(missing_ok=True)
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": f"{oracle_python().parent}:/usr/bin:/bin"}
    done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    check = (
        "import numpy as n, torch as t; m = t.load('vocab/specforge.pt', weights_only=True); "
        "print(all(m[k].dtype == t.from_numpy(n.load(f'vocab/{k}.npy')).dtype and "
        "t.equal(m[k], t.from_numpy(n.load(f'vocab/{k}.npy'))) for k in ('d2t', 't2d')), sorted(m))"
    )
    loaded = subprocess.run([str(oracle_python()), "-c", check], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert loaded.stdout.strip() == "True ['d2t', 't2d']", loaded.stderr[-2000:]
