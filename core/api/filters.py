from typing import Any

import django_filters

from core.api.parsers import utc_instant
from core.models import AuditEvent


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time filter that queries in UTC, whatever offset the caller wrote."""

    def filter(self, qs: Any, value: Any) -> Any:
        return super().filter(qs, utc_instant(value, self.field_name) if value else value)


class AuditEventFilter(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant_slug")
    actor = django_filters.CharFilter(field_name="actor_name")
    action = django_filters.CharFilter(field_name="action")
    action_prefix = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    target_type = django_filters.CharFilter(field_name="target_type")
    target_id = django_filters.CharFilter(field_name="target_id")
    request_id = django_filters.CharFilter(field_name="request_id")
    since = UTCDateTimeFilter(field_name="occurred_at", lookup_expr="gte")
    until = UTCDateTimeFilter(field_name="occurred_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields: list[str] = []
