"""The ProfileSession wing: kopf's handlers and one daemon per session (lifecycle, its pure phases),
the fan-out to the sidecars, the status the operator alone writes, the pod record, the analysis Job
(what the operator creates and what the Job runs), cancellation, and `stepscope get` / `report`."""
