"""kombu's integration mixins as kombu's own transport test files use them (test_redis.py,
test_mongodb.py): one subclass per mixin, run here with the partq connection of conftest.py.
Nothing is overridden: partq's transport passes the mixins as written (priorities in AMQP's
order, drain_events delivering what is ready, as py-amqp does)."""
from __future__ import annotations

from t.integration.common import (
    BaseExchangeTypes,
    BaseMessage,
    BasePriority,
    BaseTimeToLive,
    BasicFunctionality,
)


class test_PartqBasicFunctionality(BasicFunctionality):
    pass


class test_PartqBaseExchangeTypes(BaseExchangeTypes):
    pass


class test_PartqBaseTimeToLive(BaseTimeToLive):
    pass


class test_PartqPriority(BasePriority):
    pass


class test_PartqBaseMessage(BaseMessage):
    pass
