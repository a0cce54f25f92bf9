"""Tests of the parts that run everything on one machine (stepscope/local)."""
