"""Every contract between stepscope's processes, in one typed home (standard library only, copied
beside the agent as `stepscope_contracts`): the ProfileSession and ProfileTrigger types (session,
trigger: each field's default, bounds and description, from which `make crds` writes the CRDs),
the phases, states and condition types (states), the sidecar's request bodies (sidecar_api), the
shared directory's words (wire) and the store's keys (layout). Importing the package loads nothing."""
