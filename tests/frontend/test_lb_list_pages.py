"""The load balancer list a page at a time: an operator of a thousand tenants sees 100 LBs and how many there are,
not all 10,000 in one page (bench-tenants: 0.74 s), and a search pages the same way."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from apps.balancers.models import LoadBalancer

pytestmark = pytest.mark.django_db


def names(html: str) -> list[str]:
    return re.findall(r'<a href="/load-balancers/\d+/">([^<]+)</a>', html)


def test_an_operator_pages_through_every_tenants_lbs_and_a_search_keeps_its_words(acme, globex, otto) -> None:
    LoadBalancer.objects.bulk_create([LoadBalancer(org=acme if k % 2 else globex, name=f"lb-{k:03d}")
                                      for k in range(230)])
    client = Client()
    client.force_login(otto.user)
    first = client.get("/load-balancers/").content.decode()
    assert len(names(first)) == 100 and names(first)[0] == "lb-000"
    assert "Page 1 of 3 · 230 load balancers" in first
    last = client.get("/load-balancers/", {"page": 3}).content.decode()
    assert names(last) == [f"lb-{k:03d}" for k in range(200, 230)]
    seen = {n for p in (1, 2, 3) for n in names(client.get("/load-balancers/", {"page": p}).content.decode())}
    assert len(seen) == 230  # every LB on exactly one page
    matching = sorted(f"lb-{k:03d}" for k in range(230) if "1" in f"{k:03d}")  # 131 of them
    found = client.get("/load-balancers/", {"q": "1"}, HTTP_HX_REQUEST="true").content.decode()
    assert names(found) == matching[:100] and f"Page 1 of 2 · {len(matching)} load balancers" in found
    assert 'href="?page=2&q=1"' in found
    assert names(client.get("/load-balancers/", {"q": "1", "page": 2}).content.decode()) == matching[100:]


def test_a_tenant_pages_only_its_own(acme, globex, alice) -> None:
    LoadBalancer.objects.bulk_create([LoadBalancer(org=globex, name=f"g-{k:03d}") for k in range(150)])
    LoadBalancer.objects.bulk_create([LoadBalancer(org=acme, name=f"a-{k:03d}") for k in range(3)])
    client = Client()
    client.force_login(alice.user)
    page = client.get("/load-balancers/").content.decode()
    assert names(page) == ["a-000", "a-001", "a-002"] and "Page 1 of" not in page
    assert names(client.get("/load-balancers/", {"page": 2}).content.decode()) == ["a-000", "a-001", "a-002"]


def test_a_hostile_page_or_search_is_answered_not_raised(acme, alice) -> None:
    LoadBalancer.objects.bulk_create([LoadBalancer(org=acme, name=f"a-{k:03d}") for k in range(120)])
    client = Client()
    client.force_login(alice.user)
    assert client.get("/load-balancers/", {"page": "\x00"}).status_code == 400  # NUL is refused everywhere
    for page in ("abc", "-1", "999999999999", "1 OR 1=1"):
        answer = client.get("/load-balancers/", {"page": page})
        assert answer.status_code == 200, page
        assert len(names(answer.content.decode())) in (100, 20), page  # the first or the last page
    long = client.get("/load-balancers/", {"q": "a-" + "x" * 10_000}).content.decode()
    assert names(long) == [] and "No load balancer matches." in long
