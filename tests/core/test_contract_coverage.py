"""Every API endpoint keeps the tenancy contract: each router prefix has a TenancyContract test class.

The contract (tests/api_contract.py) gives anonymous 401, viewer-write 403, outsider 404 and absence from
lists, and owner CRUD; a new endpoint without a contract class fails here.
"""

from __future__ import annotations

import importlib
import pkgutil

import tests
from controlplane.api import router
from tests.api_contract import TenancyContract


def _contract_classes() -> list[type[TenancyContract]]:
    for info in pkgutil.walk_packages(tests.__path__, "tests."):
        if info.name.rsplit(".", 1)[-1].startswith("test_api_tenancy"):
            importlib.import_module(info.name)
    found, pending = [], list(TenancyContract.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_router_endpoint_has_a_tenancy_contract():
    covered = {cls.url.split("/")[3] for cls in _contract_classes() if cls.url}
    registered = {prefix for prefix, _viewset, _basename in router.registry}
    assert registered - covered == set(), f"endpoints without a TenancyContract class: {registered - covered}"
