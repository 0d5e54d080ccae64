"""Every write to the ledger. Each transition checks its from-state and appends its audit event in
the same transaction; nothing outside this package assigns a state."""
