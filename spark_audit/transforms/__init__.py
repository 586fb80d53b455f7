"""Pure ``DataFrame -> DataFrame`` transforms of the audit (no reads, no writes)."""
