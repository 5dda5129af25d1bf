"""Every write the platform core makes. One action, one function, shared by API, dashboard, tasks and
commands; each checks the actor's permission, writes in one transaction and records one audit event."""
