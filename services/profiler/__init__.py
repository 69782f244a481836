"""The profiler: learns speed and power per (GPU model, workload class, framework)."""
