"""Prompt datasets: reading sources, normalizing rows, preparing tokenized shards."""
