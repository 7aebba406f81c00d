"""Cloud synthesis layer: CloudLB (deploy.model) -> Terraform JSON, through CDK Terrain (cdktn, the
maintained continuation of terraform-cdk; see requirements-cloud.txt for what the move changed).

Importing `deploy` is cheap and needs no cdktn: the model, the limit checker and `synthesize` are
importable everywhere; cdktn and the providers load on the first `warm()` or `synthesize()`.
"""

from deploy.limits import LimitError, LimitViolation, check_limits
from deploy.model import (
    CloudLB,
    CloudListener,
    CloudMember,
    CloudPool,
    CloudPoolRegion,
    CloudRegionNetwork,
    CloudRoute,
    HealthCheck,
    RouteTarget,
)
from deploy.synth import synthesis_count, synthesize, warm

__all__ = [
    "CloudLB",
    "CloudListener",
    "CloudMember",
    "CloudPool",
    "CloudPoolRegion",
    "CloudRegionNetwork",
    "CloudRoute",
    "HealthCheck",
    "LimitError",
    "LimitViolation",
    "RouteTarget",
    "check_limits",
    "synthesis_count",
    "synthesize",
    "warm",
]
