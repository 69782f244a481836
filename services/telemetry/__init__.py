"""Telemetry: publishes each node's spec and GPU readings (simulated or from NVML)."""
