"""medfaq: summarizer."""
