"""The injection wing: the mutating webhook that adds the sidecar to labelled training pods
(webhook, injection) and its serving certificate (certs); each namespace's signing key, which the
sessions' fan-out signs with too, is the operator's (stepscope.operator.namespace_keys)."""
