"""medfaq: eval."""
