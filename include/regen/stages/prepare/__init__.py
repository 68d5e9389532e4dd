"""Prompt datasets: reading sources, normalising rows, preparing tokenised shards."""
