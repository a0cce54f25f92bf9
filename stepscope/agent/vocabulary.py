"""The stepscope modules the agent shares with the sidecar, under the name each has where the agent
runs: in the stepscope package (tests, `stepscope capture`), or in a training pod's bootstrap
folder, where the bootstrap writes them beside the agent's package (docs/wire.md)."""
from __future__ import annotations

import importlib

if __name__.startswith("stepscope."):  # stepscope.agent, imported from the stepscope package
    from stepscope.contracts import wire

    CONTRACTS = "stepscope.contracts"
else:  # the bootstrap's copy (stepscope_agent), beside the bootstrap's stepscope_contracts
    from stepscope_contracts import wire  # type: ignore[no-redef,import-not-found]  # only a training pod has this copy

    CONTRACTS = "stepscope_contracts"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stepscope.contracts.sidecar_api import CaptureRequest


def capture_request(raw: bytes) -> CaptureRequest:
    """request.json read straight into the contract's CaptureRequest: the spec's defaults for what
    a hand-written one leaves out, its bounds checked (a SpecError, a ValueError, says which
    field). Imported at the first request: the types cost a process that never profiles ~3 ms at
    start."""
    parsed: CaptureRequest = _sidecar_api().CaptureRequest.from_json(raw, "request.json")
    return parsed


def answer_only(session: str) -> CaptureRequest:
    """A request that only names its session: what an agent answers without capturing."""
    answer: CaptureRequest = _sidecar_api().CaptureRequest(session=session)
    return answer


def _sidecar_api() -> Any:
    return importlib.import_module(f"{CONTRACTS}.sidecar_api")


__all__ = ["answer_only", "capture_request", "wire"]
