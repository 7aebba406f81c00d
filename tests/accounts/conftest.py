from tests.balancers.conftest import world  # noqa: F401  (the same small world of LBs and pools)
