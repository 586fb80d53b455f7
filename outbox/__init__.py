"""outbox package."""
