"""medfaq: retriever."""
