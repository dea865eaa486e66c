"""Training drafters on the target's own outputs: prompts, data, heads, training loops."""
