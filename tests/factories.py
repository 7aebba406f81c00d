"""factory-boy factories for the domain; every app's tests build on these."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from apps.accounts.models import Membership, Organization, Role
from apps.balancers.models import (
    HostnameClaim,
    IpPool,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    Route,
    RouteTarget,
)


class OrganizationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organization
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"org-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())
    kind = Organization.Kind.CUSTOMER


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user-{n}")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-battery")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    org = factory.SubFactory(OrganizationFactory)
    role = Role.ADMIN


class RegionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Region
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"region-{n}")
    name = factory.LazyAttribute(lambda o: o.slug)


class LoadBalancerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = LoadBalancer

    org = factory.SubFactory(OrganizationFactory)
    name = factory.Sequence(lambda n: f"lb-{n}")


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Pool

    lb = factory.SubFactory(LoadBalancerFactory)
    org = factory.LazyAttribute(lambda o: o.lb.org)
    name = factory.Sequence(lambda n: f"pool-{n}")


class PoolRegionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PoolRegion

    pool = factory.SubFactory(PoolFactory)
    region = factory.SubFactory(RegionFactory)
    max_rate_per_member = 100


class MemberFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Member

    pool = factory.SubFactory(PoolFactory)
    region = factory.SubFactory(RegionFactory)
    name = factory.Sequence(lambda n: f"m-{n}")
    address = factory.Sequence(lambda n: f"127.0.{30 + n // 250}.{1 + n % 250}")
    port = 8000


class HostnameClaimFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = HostnameClaim

    org = factory.SubFactory(OrganizationFactory)
    hostname = factory.Sequence(lambda n: f"app{n}.example.com")
    status = HostnameClaim.Status.APPROVED


class RouteFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Route
        skip_postgeneration_save = True

    lb = factory.SubFactory(LoadBalancerFactory)
    org = factory.LazyAttribute(lambda o: o.lb.org)
    hosts = factory.List([])
    path = "/"
    priority = factory.Sequence(lambda n: 1000 + n)

    @factory.post_generation
    def pool(self, create, extracted, **kwargs):
        if create and extracted is not None:
            RouteTarget.objects.create(route=self, pool=extracted, weight=100)


class IpPoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = IpPool

    name = factory.Sequence(lambda n: f"ips-{n}")
    cidr = "192.0.2.0/28"
