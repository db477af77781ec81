"""medfaq: the small helpers every package may import (errors, paths under MEDFAQ_HOME, model names, devices,
precision, seeds, logging); it imports no other medfaq package."""
