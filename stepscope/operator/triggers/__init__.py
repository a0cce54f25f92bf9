"""The ProfileTrigger wing: the trigger as a pure function (policy), its daemon that polls the
sidecars' step telemetry and creates sessions, and the Alertmanager webhook (alerts)."""
