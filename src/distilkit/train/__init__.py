"""The distillation loop, teacher cache and checkpoints."""
