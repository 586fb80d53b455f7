"""ackd package."""
