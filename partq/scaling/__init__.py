"""Scaling a queue: the partition count change (``count``) and the seven-step procedure around
it (``procedure``), which keeps a record in the store while it runs (``record``)."""
from partq.errors import ScalingStepFailed
from partq.scaling.count import change_count, finish_retirements, finish_scaling
from partq.scaling.procedure import (
                                     POLL,
                                     Reporter,
                                     abort,
                                     check_scalable,
                                     describe_ingress_off,
                                     publishes_while_ingress_off,
                                     rebalance_settled,
                                     replication_status,
                                     run,
                                     wait_for_standby,
)
from partq.scaling.record import PROCEDURE, STEPS, Procedure, procedure_of, read_procedure

__all__ = ["POLL", "PROCEDURE", "STEPS", "Procedure", "Reporter", "ScalingStepFailed", "abort",
           "change_count", "check_scalable", "describe_ingress_off", "finish_retirements",
           "finish_scaling",
           "procedure_of", "publishes_while_ingress_off", "read_procedure", "rebalance_settled",
           "replication_status", "run", "wait_for_standby"]
