"""eagle3_training_handoff: the hand-off from eagle3_regen to drafter training.

Scheduled on the datasets eagle3_regen publishes (one asset per dataset, announced through the alias
`eagle3_regen_datasets`), it verifies every newly published version against its manifest (the manifest's own sha256
as the event carries it, each file's sha256 and size, every record's invariants) before training may read it, then
writes SpecForge's copy of its draft vocabulary (vocab/specforge.pt) where torch is installed. An example to
extend: put the training job's trigger after `verify_version`, or schedule on a single dataset's asset instead of
the alias.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, get_current_context, task

from regen_airflow.tasks import PUBLISHED_DATASETS, final_errors_fail_now, s3_client_for


@dag(
    dag_id="eagle3_training_handoff",
    doc_md=__doc__,
    schedule=[PUBLISHED_DATASETS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["eagle3", "training-data"],
    default_args={"retries": 2},
)
def eagle3_training_handoff() -> None:
    @task(inlets=[PUBLISHED_DATASETS])
    def published_versions(**context: Any) -> list[dict[str, Any]]:
        """The manifests of the versions whose publication triggered this run, each with its sha256."""
        events = context["triggering_asset_events"]
        extras = [e.extra for asset in events for e in events[asset] if "manifest" in e.extra]
        manifests = {extra["manifest"]: extra.get("manifest_sha256") for extra in extras}
        return [{"manifest": m, "manifest_sha256": sha} for m, sha in sorted(manifests.items())]

    @task(map_index_template="{{ label }}")
    def verify_version(version: dict[str, Any]) -> dict[str, Any]:
        from regen.verify import verify_published

        manifest = version["manifest"]
        get_current_context()["label"] = manifest  # type: ignore[typeddict-unknown-key]
        with final_errors_fail_now():  # a version that does not match its manifest stays wrong
            return verify_published(manifest, s3_client_for(manifest), version["manifest_sha256"])

    @task(map_index_template="{{ label }}")
    def specforge_vocab_mapping(verified: dict[str, Any]) -> str | None:
        """vocab/specforge.pt, the .npy pair as SpecForge's trainer loads it; none without torch (docs/data.md)."""
        from regen.stages.publish.vocab_files import write_specforge_mapping

        manifest = verified["manifest"]
        get_current_context()["label"] = manifest  # type: ignore[typeddict-unknown-key]
        return write_specforge_mapping(manifest, s3_client_for(manifest))

    specforge_vocab_mapping.expand(verified=verify_version.expand(version=published_versions()))


eagle3_training_handoff()
