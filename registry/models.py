"""Tables of the registry capability (arrive with its issue)."""
