"""The parts that run everything on one machine: the `stepscope capture` and `stepscope demo`
commands, the local gloo launcher, the fault-injection scenarios and the torch workload they train.

This is the roof: it may import the core, the sidecar and the analysis; nothing below imports it
(tests/test_architecture.py checks that).
"""
