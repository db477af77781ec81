"""medfaq: training the summarizer."""
