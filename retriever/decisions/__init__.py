"""Per-index decisions, calibration and adaptation: which stages and parts an index keeps, its thresholds."""
