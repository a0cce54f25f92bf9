"""Tests of the in-memory API server (stepscope/testing/kube)."""
