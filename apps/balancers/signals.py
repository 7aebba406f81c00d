"""Signals other apps listen to, so balancers never imports fleets or cloud."""

from django.dispatch import Signal

# Sent after commit with lb_id and revision whenever what an LB must serve changed.
lb_changed = Signal()
# Sent after commit with member_id when only a member's admin state or weight changed
# (fleets apply it through the runtime API at once, without a reload).
member_runtime_changed = Signal()
