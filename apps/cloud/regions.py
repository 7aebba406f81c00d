"""Spillway region slugs -> provider region names, per cloud target (no Django).

Spillway's regions (`us-east`, `eu-west`) are its own names; no provider accepts them as `region`. Each
target stores an explicit map; on save, regions it leaves out are filled from the well-known table
below (shown back in the API, so nothing is implicit afterwards) and any region still unmapped, or
mapped to something that is not a region name of the target's provider, is refused.
"""

from __future__ import annotations

import re

WELL_KNOWN: dict[str, dict[str, str]] = {
    "gcp": {"us-east": "us-east1", "us-central": "us-central1", "us-west": "us-west1",
            "eu-west": "europe-west1", "eu-central": "europe-west3", "ap-southeast": "asia-southeast1",
            "ap-northeast": "asia-northeast1"},
    "aws": {"us-east": "us-east-1", "us-central": "us-east-2", "us-west": "us-west-2",
            "eu-west": "eu-west-1", "eu-central": "eu-central-1", "ap-southeast": "ap-southeast-1",
            "ap-northeast": "ap-northeast-1"},
}
# Shapes of real region names: GCP `us-east1`, `europe-west4`, `northamerica-northeast2`;
# AWS `us-east-1`, `eu-central-2`, `us-gov-west-1`.
PATTERNS = {
    "gcp": re.compile(r"^[a-z]+-[a-z]+[0-9]{1,2}$"),
    "aws": re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]{1,2}$"),
}


class UnmappedRegion(ValueError):
    def __init__(self, region: str, message: str) -> None:
        super().__init__(message)
        self.region = region


def complete_region_map(provider: str, regions: list[str], region_map: dict[str, str]) -> dict[str, str]:
    """`region_map` with every region of `regions` mapped (well-known defaults filled in), or
    UnmappedRegion naming the first region that has no valid provider region."""
    pattern = PATTERNS[provider]
    done = {}
    for region in regions:
        target = region_map.get(region) or WELL_KNOWN[provider].get(region)
        if target is None and pattern.fullmatch(region):
            target = region  # already a provider region name (targets saved before the map existed)
        if target is None:
            raise UnmappedRegion(region, f"Region {region} has no {provider.upper()} region: map it, "
                                         f"e.g. {{\"{region}\": \"{next(iter(WELL_KNOWN[provider].values()))}\"}}.")
        if not isinstance(target, str) or not pattern.fullmatch(target):
            raise UnmappedRegion(region, f"{target!r} is not a {provider.upper()} region name.")
        done[region] = target
    extra = sorted(set(region_map) - set(regions))
    if extra:
        raise UnmappedRegion(extra[0], f"Region {extra[0]} is mapped but not one of the target's regions.")
    return done


def provider_region(region_map: dict[str, str], region: str) -> str:
    return region_map.get(region, region)
