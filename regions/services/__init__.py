"""Every write of regions and deployments: permission, validation, one transaction, one audit event."""
