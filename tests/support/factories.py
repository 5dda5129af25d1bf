"""factory_boy factories for the whole suite, in one place."""

import factory

from core.choices import TenantRole
from core.models import Membership, ServiceAccount, Tenant, User

PASSWORD = "correct-horse-battery-9"


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())
    residency = factory.LazyFunction(lambda: ["EU"])


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def save_password(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = TenantRole.ADMIN


class ServiceAccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ServiceAccount

    name = factory.Sequence(lambda n: f"robot-{n}")
    tenant = factory.SubFactory(TenantFactory)
    role = TenantRole.DEVELOPER
