"""An in-memory Kubernetes API server over real HTTP, for kopf and the kubernetes client (README.md)."""
