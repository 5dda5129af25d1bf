"""The data plane: an async OpenAI-compatible gateway that enforces the control plane's route table.

It never imports Django and never talks to the database: its only state is the route table (with the
token digests) it fetches from the control plane, cached on disk so it keeps serving when the control
plane is down.
"""
