"""The operator's kopf registry, built fresh for every run.

kopf's decorators default to one process-wide registry, and `kopf run` with an explicit registry
makes that one the default for good; handlers registered at import time would then leak between
runs in one process (tests, the fan-out benchmark) or go missing. Building the registry from
`register` functions keeps each run's handlers exactly what it asked for.
"""
from __future__ import annotations

import kopf

from stepscope.operator.injection import webhook
from stepscope.operator.sessions import handlers
from stepscope.operator.triggers import daemon as triggers_daemon


def build(*, with_webhook: bool = False) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    triggers_daemon.register(registry)
    if with_webhook:
        webhook.register(registry)
    return registry
