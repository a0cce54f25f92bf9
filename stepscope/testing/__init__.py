"""The test doubles that the tests and the benchmarks share: an in-memory Kubernetes API server
(kube), a simulated GPU node and a stand-in NVML library (nvml), synthetic rank summaries and a
poll-until helper. No part of stepscope imports them (tests/test_architecture.py), and the
image's install leaves them out (pyproject.toml's package list)."""
