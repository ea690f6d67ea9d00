"""Files a user keeps: written whole (atomic), locked, checkpointed; run directories."""
