"""Schemathesis against the live server (all checks, few examples): no 500 and no answer the schema does not
describe. The bigger run is `make bench-fuzz`."""

from __future__ import annotations

import pytest

from tests.fuzz import run_schemathesis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def test_live_api_conforms_to_its_schema_and_never_answers_500(live_server, otto, acme) -> None:
    result = run_schemathesis(live_server.url, otto.token, max_examples=1, workers=2, max_time_s=45,
                              phases="examples,fuzzing")
    assert result.operations > 50, result.output[-3000:]
    assert (result.server_errors, result.conformance_failures) == (0, 0), "\n".join(result.blocking[:20])
