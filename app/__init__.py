"""medfaq: app."""
