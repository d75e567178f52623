"""The driver's plan: which tiered segments (or pieces of them) a run converts, and from which state."""
