"""The demo agent: invoice analysis that really runs against the sandbox through the ledger."""
