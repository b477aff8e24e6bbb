"""Run reports: summary tables and a diagnosis of what limits training speed (Kedro-free)."""
