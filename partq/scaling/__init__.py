"""Scaling a queue: the partition count change (``count``) and the seven-step procedure around
it (``procedure``), which keeps a record in the store while it runs (``record``).

The names below load on first use (``partq.lazy``): importing one module of this room does
not import the others."""
from typing import TYPE_CHECKING

from partq.errors import ScalingStepFailed as ScalingStepFailed
from partq.lazy import lazy_names

_NAMES = {"change_count": "count", "finish_retirements": "count", "finish_scaling": "count",
          "POLL": "procedure", "Reporter": "procedure", "abort": "procedure",
          "check_scalable": "procedure", "describe_ingress_off": "procedure",
          "publishes_while_ingress_off": "procedure", "rebalance_settled": "procedure",
          "replication_status": "procedure", "run": "procedure", "wait_for_standby": "procedure",
          "PROCEDURE": "record", "Procedure": "record", "STEPS": "record",
          "procedure_of": "record", "read_procedure": "record"}

__all__ = sorted([*_NAMES, "ScalingStepFailed"])
__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
    from partq.scaling.count import change_count as change_count
    from partq.scaling.count import finish_retirements as finish_retirements
    from partq.scaling.count import finish_scaling as finish_scaling
    from partq.scaling.procedure import POLL as POLL
    from partq.scaling.procedure import Reporter as Reporter
    from partq.scaling.procedure import abort as abort
    from partq.scaling.procedure import check_scalable as check_scalable
    from partq.scaling.procedure import describe_ingress_off as describe_ingress_off
    from partq.scaling.procedure import publishes_while_ingress_off as publishes_while_ingress_off
    from partq.scaling.procedure import rebalance_settled as rebalance_settled
    from partq.scaling.procedure import replication_status as replication_status
    from partq.scaling.procedure import run as run
    from partq.scaling.procedure import wait_for_standby as wait_for_standby
    from partq.scaling.record import PROCEDURE as PROCEDURE
    from partq.scaling.record import STEPS as STEPS
    from partq.scaling.record import Procedure as Procedure
    from partq.scaling.record import procedure_of as procedure_of
    from partq.scaling.record import read_procedure as read_procedure
