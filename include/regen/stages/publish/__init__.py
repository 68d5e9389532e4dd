"""Publish: a verified dataset version's report (dataset_report) and its manifest, written last (publish)."""
