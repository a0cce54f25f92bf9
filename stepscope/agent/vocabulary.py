"""The stepscope modules the agent shares with the sidecar, under the name each has where the agent
runs: in the stepscope package (tests, `stepscope capture`), or in a training pod's bootstrap
folder, where the bootstrap writes them beside the agent's package (docs/wire.md)."""
from __future__ import annotations

if __name__.startswith("stepscope."):  # stepscope.agent, imported from the stepscope package
    from stepscope.contracts import wire
else:  # the bootstrap's copy (stepscope_agent), beside the bootstrap's stepscope_wire
    import stepscope_wire as wire  # type: ignore[no-redef,import-not-found]  # only a training pod has this copy

__all__ = ["wire"]
