"""The injection wing: the mutating webhook that adds the sidecar to labelled training pods
(webhook, injection), its serving certificate (certs), and each namespace's signing key
(namespace_keys)."""
