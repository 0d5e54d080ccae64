"""HTTP operations on external systems, with an idempotency key and a status lookup."""
