"""What a published version says of its decontamination: the manifest names each suite with its sha256 and the
prompts it rejected, the dataset report counts them, and the Drafter data page shows them."""

from __future__ import annotations

import json
from pathlib import Path

from regen.chat import ChatRenderer
from regen.config import DecontaminationConfig, EvalSuite, load_config
from regen.layout import DatasetLocation, report_writer
from regen.manifest import PreparedDataset
from regen.stages.prepare.decontaminate import prompt_text
from regen.stages.prepare.eval_suites import load_suites
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.stages.publish.publish import run_publish
from regen.storage import LocalStorage
from regen.ui.catalog import Catalog
from regen.ui.page import page
from tests.conftest import Simulator, finish_shards
from tests.unit.stages.prepare.test_decontaminate import GSM8K


def test_the_manifest_report_and_page_name_the_suites(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    from regen.stages.prepare.formats import normalize_row

    config = load_config()
    source = config.dataset("B1_glaive")
    rows = Path(config.resolve(source.paths[0])).read_text().splitlines()  # type: ignore[index]
    first = normalize_row(json.loads(rows[0]), "auto", renderer.profile.tool_call_id_format, "final", "as_given")
    assert isinstance(first, list)
    leaked = prompt_text(first[0].messages[:2])  # the start of one of the dataset's own prompts
    suite_file = tmp_path / "held_out.jsonl"
    suite_file.write_text(json.dumps({"text": leaked}) + "\n" + json.dumps({"text": GSM8K}) + "\n")
    held_out = EvalSuite(name="held_out", path=str(suite_file), field="text")
    suites = DecontaminationConfig(suites=[held_out, EvalSuite(name="humaneval", path="builtin:humaneval")])
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "B1_glaive", "v1")
    prepared = run_prepare(
        source,
        location,
        storage,
        renderer,
        PrepareSettings(
            shard_size=10, limit=12, resolve_path=config.resolve, workers=1, decontamination=load_suites(suites)
        ),
    )
    assert isinstance(prepared, PreparedDataset)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    run_publish(prepared, storage, fleet=[], run_id="manual__v1")

    manifest = json.loads(storage.get_bytes(location.manifest))
    cleaned = manifest["decontamination"]
    assert [(s["name"], len(s["sha256"])) for s in cleaned["suites"]] == [("held_out", 64), ("humaneval", 64)]
    # The sample's prompts are templated ("Request 3: can you help me with convert currency for Paris?"): those a word
    # or two away from the leaked one hold most of its n-grams too, and go with it.
    leaks = manifest["prepare"]["dropped_by_reason"]["eval_overlap"]
    assert leaks >= 1 and cleaned["rejected_by_suite"] == {"held_out": leaks, "humaneval": 0}
    writer = report_writer(manifest)  # the report is in its publisher's own folder
    report = json.loads(storage.get_bytes(location.report_file("report.json", writer)))
    assert report["decontamination"]["rejected_by_suite"] == {"held_out": leaks, "humaneval": 0}
    report_html = storage.get_bytes(location.report_file("report.html", writer)).decode()
    assert "<h2>Eval-set decontamination</h2>" in report_html and cleaned["suites"][0]["sha256"] in report_html

    latest = Catalog(storage, renderer.profile.name).overview(["B1_glaive"]).datasets[0]["latest"]
    sha = {s["name"]: s["sha256"] for s in cleaned["suites"]}
    assert latest["eval_suites"] == [
        {"name": "held_out", "sha256": sha["held_out"], "rejected": leaks},
        {"name": "humaneval", "sha256": sha["humaneval"], "rejected": 0},
    ]
    html = page(
        storage.root_uri, renderer.profile.name, Catalog(storage, renderer.profile.name).overview(["B1_glaive"])
    )
    assert "cleaned against" in html and f'title="sha256 {sha["held_out"]}">held_out {sha["held_out"][:12]}' in html
