"""The schemathesis harness (tests/fuzz.py) itself: its lockout pass names real operations, and it reads
schemathesis' case count from the summary it prints."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from tests.fuzz import LOCKOUT_OPERATIONS, cases_generated


@pytest.mark.django_db
def test_every_lockout_operation_is_an_operation_of_the_schema() -> None:
    # A misspelt id would silently exclude nothing, and the run would fuzz its own token away again.
    schema = SchemaGenerator().get_schema(request=None, public=True)
    ids = {op["operationId"] for path in schema["paths"].values() for op in path.values() if "operationId" in op}
    assert set(LOCKOUT_OPERATIONS) - ids == set()
    assert {"tokens_destroy", "tokens_revoke_create"} <= set(LOCKOUT_OPERATIONS)


def test_the_case_count_comes_from_schemathesis_summary() -> None:
    summary = ("Test Phases:\n  ✅ Examples\n\nTest cases:\n  2841 generated, 2 found 2 unique failures, 6 skipped\n\n"
               "Seed: 1\n")
    assert cases_generated(summary) == 2841
    assert cases_generated("no summary at all") == 0
