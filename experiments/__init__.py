"""The experiment drivers behind sections of docs/results.md, each run as ``python experiments/NAME.py ARGS`` from the
repository root; not part of the installed ``medfaq`` package, which never imports them."""
