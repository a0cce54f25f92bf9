"""An in-memory Kubernetes API server over real HTTP, for tests (see README.md in this folder)."""
