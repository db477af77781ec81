"""medfaq: index."""
