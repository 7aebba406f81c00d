"""A PreparedQuery answers what its queryset answers, compiles once, and refuses what it cannot tell apart.

The API token lookup (apps.accounts.services.token_authenticate) runs through one on every API call: a mistake here
lets an expired, revoked or wrong token in, so the token cases are compared with the ORM's own answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, models
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone

from apps.accounts.models import ApiToken, Membership
from apps.accounts.services import (
    _token_by_prefix,
    principal_for_token,
    token_authenticate,
    token_create,
    token_revoke,
)
from apps.core.prepared import PreparedQuery, PreparedUpdate
from tests.factories import MembershipFactory, OrganizationFactory, UserFactory

pytestmark = pytest.mark.django_db
User = get_user_model()

PROBES = {"prefix": ("probe-a", "probe-b"),
          "now": (datetime(2001, 1, 1, tzinfo=UTC), datetime(2002, 2, 2, tzinfo=UTC))}


def _fields(token: ApiToken | None) -> tuple | None:
    if token is None:
        return None
    return (token.pk, token.prefix, token.secret_hash, token.revoked_at, token.expires_at, token.org.slug,
            token.user.username if token.user else None, token.owner_role, token.scopes)


@pytest.fixture
def tokens():
    org = OrganizationFactory(slug="acme")
    user = UserFactory(username="ann")
    MembershipFactory(user=user, org=org, role="editor")
    now = timezone.now()
    live = token_create(org=org, name="live", scopes=["read"], user=user)
    expired = token_create(org=org, name="expired", scopes=["read"], user=user, expires_at=now + timedelta(hours=1))
    revoked = token_create(org=org, name="revoked", scopes=["read"], user=user)
    token_revoke(token=revoked.token, principal=None)
    machine = token_create(org=org, name="machine", scopes=["read"])
    return {"live": live, "expired": expired, "revoked": revoked, "machine": machine, "now": now}


def test_the_prepared_lookup_answers_as_the_orm_for_every_kind_of_token(tokens) -> None:
    prepared = PreparedQuery(_token_by_prefix, PROBES)
    if connection.vendor == "postgresql":  # or this would compare the ORM with itself
        assert prepared._prepared("default") is not None
    later = tokens["now"] + timedelta(hours=2)  # past the expiring token's end
    for created in ("live", "expired", "revoked", "machine"):
        prefix = tokens[created].secret.split("_")[1]
        for now in (tokens["now"], later):
            expected = _fields(_token_by_prefix(prefix, now).first())
            assert _fields(prepared.first(prefix=prefix, now=now)) == expected, (created, now)
    assert _fields(prepared.first(prefix="nosuch", now=later)) is None
    # What the lookup decides, as a user meets it.
    assert _fields(prepared.first(prefix=tokens["expired"].secret.split("_")[1], now=later)) is None
    assert prepared.first(prefix=tokens["revoked"].secret.split("_")[1], now=timezone.now()) is None
    assert prepared.first(prefix=tokens["machine"].secret.split("_")[1], now=later).owner_role is None
    # A removed member's token and a deactivated user's: found, but with no role (principal_for_token refuses it).
    live = tokens["live"].secret.split("_")[1]
    Membership.objects.filter(user__username="ann").delete()
    assert prepared.first(prefix=live, now=later).owner_role is None
    assert _fields(prepared.first(prefix=live, now=later)) == _fields(_token_by_prefix(live, later).first())
    assert token_authenticate(tokens["live"].secret) is not None
    assert principal_for_token(token_authenticate(tokens["live"].secret)) is None
    MembershipFactory(user=tokens["live"].token.user, org=tokens["live"].token.org, role="editor")
    assert principal_for_token(token_authenticate(tokens["live"].secret)) is not None
    User.objects.filter(username="ann").update(is_active=False)
    assert prepared.first(prefix=live, now=later).owner_role is None
    assert principal_for_token(token_authenticate(tokens["live"].secret)) is None


def test_token_authenticate_compiles_its_query_once(tokens, monkeypatch) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared on PostgreSQL only")
    secret = tokens["live"].secret
    assert token_authenticate(secret) is not None  # compiled by now (here or by an earlier test)
    compiled = []
    as_sql = SQLCompiler.as_sql
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda self, *a, **kw: compiled.append(1) or as_sql(self, *a, **kw))
    for _ in range(3):
        token = token_authenticate(secret)
        assert token is not None and token.org.slug == "acme" and token.owner_role == "editor"
    assert token_authenticate(secret[:-1] + ("x" if secret[-1] != "x" else "y")) is None  # wrong secret
    assert compiled == []


def test_values_that_are_not_parameters_or_change_the_shape_run_as_the_orm_would(tokens) -> None:
    # `now` is not used by this build: nothing tells it apart, so the query is never prepared.
    unused = PreparedQuery(lambda prefix, now: ApiToken.objects.filter(prefix=prefix), PROBES)
    prefix = tokens["live"].secret.split("_")[1]
    assert [t.pk for t in unused.all(prefix=prefix, now=tokens["now"])] == [tokens["live"].token.pk]
    assert unused._prepared("default") is None
    prepared = PreparedQuery(_token_by_prefix, PROBES)
    # None would be `IS NULL` in SQL: a value of another type than the probes' runs through the ORM.
    assert prepared.all(prefix=prefix, now=None) == list(_token_by_prefix(prefix, None))
    with pytest.raises(TypeError):
        prepared.all(prefix=prefix)


def test_what_the_fast_path_would_get_wrong_is_not_prepared(tokens, caplog) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared on PostgreSQL only")
    prefix = tokens["live"].secret.split("_")[1]
    refused = {
        "prefetch": lambda prefix, now: ApiToken.objects.prefetch_related("children").filter(prefix=prefix,
                                                                                               created_at__lt=now),
        "values": lambda prefix, now: ApiToken.objects.filter(prefix=prefix, created_at__lt=now).values("pk"),
        "empty": lambda prefix, now: ApiToken.objects.filter(prefix=prefix, created_at__lt=now, pk__in=[]),
    }
    for name, build in refused.items():
        query = PreparedQuery(build, PROBES)
        with caplog.at_level("WARNING", logger="apps.core.prepared"):
            answer = query.all(prefix=prefix, now=timezone.now())
        assert query._prepared("default") is None, name
        assert answer == list(build(prefix, timezone.now())), name  # the ORM's answer all the same
    assert "is not prepared" in caplog.text
    # A naive `now` (Django would make it aware before binding it) runs through the ORM.
    prepared = PreparedQuery(_token_by_prefix, PROBES)
    naive = datetime.now()
    with pytest.warns(RuntimeWarning):  # Django's own: naive datetime while time zone support is active
        assert _fields(prepared.first(prefix=prefix, now=naive)) == _fields(_token_by_prefix(prefix, naive).first())


def test_values_list_rows_answer_as_the_orm_with_converters_and_wrapped_integers(tokens) -> None:
    """values_list rows (tuples and flat), with their converters (a JSON list, an aware datetime) and a range lookup
    on an integer (psycopg's Int8 of it in the compiled parameters), as the ORM answers them."""
    def rows(after_pk: int, org_id: int):  # type: ignore[no-untyped-def]
        return (ApiToken.objects.filter(pk__gt=after_pk, org_id=org_id).order_by("pk")
                .values_list("pk", "name", "scopes", "created_at"))

    def names(after_pk: int, org_id: int):  # type: ignore[no-untyped-def]
        return ApiToken.objects.filter(pk__gt=after_pk, org_id=org_id).order_by("pk").values_list("name", flat=True)

    tuples = PreparedQuery(rows, {"after_pk": (1, 2), "org_id": (3, 4)})
    flat = PreparedQuery(names, {"after_pk": (1, 2), "org_id": (3, 4)})
    org_id = tokens["live"].token.org_id
    first_pk = tokens["live"].token.pk
    for after in (0, first_pk, first_pk + 2, first_pk + 100):
        assert tuples.all(after_pk=after, org_id=org_id) == list(rows(after, org_id))
        assert flat.all(after_pk=after, org_id=org_id) == list(names(after, org_id))
    assert tuples.all(after_pk=0, org_id=org_id)[0][2] == ["read"]  # JSON, converted
    assert flat.first(after_pk=0, org_id=org_id + 1000) is None
    if connection.vendor == "postgresql":
        assert tuples._prepared("default") is not None and flat._prepared("default") is not None
    # Fields asked in another order than their columns (an annotation named first) are left to the ORM.
    reordered = PreparedQuery(
        lambda org_id: ApiToken.objects.filter(org_id=org_id).annotate(n=models.Value(1)).values_list("n", "pk"),
        {"org_id": (3, 4)})
    assert sorted(reordered.all(org_id=org_id)) == sorted((1, t.pk) for t in ApiToken.objects.filter(org_id=org_id))
    assert reordered.refused() == (connection.vendor == "postgresql")


def test_a_prepared_update_changes_what_the_orms_update_changes_and_counts_the_same_rows(tokens, monkeypatch) -> None:
    def rename(org_id: int, below_pk: int, name: str, at: datetime):  # type: ignore[no-untyped-def]
        return ApiToken.objects.filter(org_id=org_id, pk__lt=below_pk), {"name": name, "last_used_at": at}

    update = PreparedUpdate(rename, {"org_id": (1, 2), "below_pk": (3, 4), "name": ("probe-a", "probe-b"),
                                     "at": (datetime(2001, 1, 1, tzinfo=UTC), datetime(2002, 2, 2, tzinfo=UTC))})
    org_id = tokens["live"].token.org_id
    pks = sorted(ApiToken.objects.filter(org_id=org_id).values_list("pk", flat=True))
    when = timezone.now()
    assert update.run(org_id=org_id, below_pk=pks[2], name="renamed", at=when) == 2
    assert dict(ApiToken.objects.filter(org_id=org_id).values_list("pk", "name")) == {
        **{pk: "renamed" for pk in pks[:2]}, **{pk: name for pk, name in zip(pks[2:], ("revoked", "machine"),
                                                                             strict=True)}}
    assert set(ApiToken.objects.filter(pk__in=pks[:2]).values_list("last_used_at", flat=True)) == {when}
    assert update.run(org_id=org_id + 1000, below_pk=pks[-1] + 1, name="nobody", at=when) == 0
    if connection.vendor != "postgresql":
        return
    assert update._prepared("default") is not None
    compiled = []
    as_sql = SQLCompiler.as_sql
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda self, *a, **kw: compiled.append(1) or as_sql(self, *a, **kw))
    from django.db.models.sql.compiler import SQLUpdateCompiler
    update_sql = SQLUpdateCompiler.as_sql
    monkeypatch.setattr(SQLUpdateCompiler, "as_sql", lambda self, *a, **kw: compiled.append(1) or update_sql(self))
    assert update.run(org_id=org_id, below_pk=pks[-1] + 1, name="all", at=when) == 4
    assert compiled == []
    # None is `= NULL` in an UPDATE's SET, another shape than the probes': the ORM runs it, with the same effect.
    assert update.run(org_id=org_id, below_pk=pks[1], name="first", at=None) == 1
    assert compiled  # through the ORM
    assert ApiToken.objects.get(pk=pks[0]).last_used_at is None and ApiToken.objects.get(pk=pks[0]).name == "first"


def test_a_list_of_ids_is_one_parameter_whatever_its_length_and_answers_as_in(tokens, monkeypatch) -> None:
    """`pk__any=[...]` (apps.core.prepared.AnyOf) answers as `pk__in` for every length (empty too), on a foreign key
    as on a primary key, and a prepared query taking a list compiles once; a list whose items are not of the probes'
    type (strings for integers) runs through the ORM, which converts them, with the same answer."""
    def by_ids(ids: list[int]):  # type: ignore[no-untyped-def]
        return ApiToken.objects.filter(pk__any=ids).order_by("pk").values_list("pk", "name")

    def by_orgs(org_ids: list[int]):  # type: ignore[no-untyped-def]
        return ApiToken.objects.filter(org_id__any=org_ids).order_by("pk").values_list("pk", flat=True)

    prepared = PreparedQuery(by_ids, {"ids": ([1, 2], [3, 4])})
    of_orgs = PreparedQuery(by_orgs, {"org_ids": ([1, 2], [3, 4])})
    pks = sorted(ApiToken.objects.values_list("pk", flat=True))
    org_id = tokens["live"].token.org_id
    expected = {tuple(ids): list(ApiToken.objects.filter(pk__in=ids).order_by("pk").values_list("pk", "name"))
                for ids in ([], pks[:1], pks[1:3], pks, [*pks, pks[-1] + 50], [pks[0], pks[0]])}
    assert prepared.all(ids=pks[:1]) == expected[tuple(pks[:1])]  # compiled by now
    assert of_orgs.all(org_ids=[org_id, org_id + 1000]) == pks
    if connection.vendor == "postgresql":
        assert prepared._prepared("default") is not None and of_orgs._prepared("default") is not None
        assert "= ANY(" in str(by_ids([1, 2]).query)
    compiled = []
    as_sql = SQLCompiler.as_sql
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda self, *a, **kw: compiled.append(1) or as_sql(self, *a, **kw))
    for ids, rows in expected.items():
        assert prepared.all(ids=list(ids)) == rows, ids
    assert of_orgs.all(org_ids=[org_id + 1000]) == []
    assert compiled == [] or connection.vendor != "postgresql"
    assert prepared.all(ids=[str(pk) for pk in pks[:2]]) == list(
        ApiToken.objects.filter(pk__in=pks[:2]).order_by("pk").values_list("pk", "name"))
    assert compiled  # the strings went through the ORM


def test_a_json_value_is_a_named_value_too(tokens) -> None:
    """A lookup into a JSON field hands the value over in psycopg's JSON wrapper: it is still a named value."""
    def with_scope(org_id: int, scope: str):  # type: ignore[no-untyped-def]
        return ApiToken.objects.filter(org_id=org_id, scopes__0=scope).order_by("pk").values_list("name", flat=True)

    prepared = PreparedQuery(with_scope, {"org_id": (1, 2), "scope": ("probe-a", "probe-b")})
    org_id = tokens["live"].token.org_id
    assert prepared.all(org_id=org_id, scope="read") == list(with_scope(org_id, "read")) != []
    assert prepared.all(org_id=org_id, scope="write") == [] == list(with_scope(org_id, "write"))
    assert prepared.refused() is (connection.vendor != "postgresql")


def test_a_json_key_named_any_is_still_a_key() -> None:
    """`field__any` is registered on integer and text fields and relations only: on a JSON field `scopes__any` keeps
    meaning the key "any" (registered on every field, it would silently have become a list test)."""
    assert "= ANY(" not in str(ApiToken.objects.filter(scopes__any="x").query)
    assert "= ANY(" in str(ApiToken.objects.filter(org_id__any=[1]).query) or connection.vendor != "postgresql"
