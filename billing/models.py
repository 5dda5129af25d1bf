"""Tables of the billing capability (arrive with its issue)."""
