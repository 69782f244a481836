"""The thermal guard: telemetry in, hold and migrate intents out (issue 14)."""
