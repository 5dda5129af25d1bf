"""Every write of the model registry: each checks permission, writes in one transaction and audits once."""
