"""Tables of the regions capability (arrive with its issue)."""
