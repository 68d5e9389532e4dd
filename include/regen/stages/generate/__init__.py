"""Generate: a shard's prompts sent to the fleet, answers checkpointed as they come (generate, checkpoints,
progress), on-policy conversations turn by turn (conversations)."""
