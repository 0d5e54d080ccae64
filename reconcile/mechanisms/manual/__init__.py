"""Work nothing can cancel or look up: a person accounts for it."""
