"""The folder `zerotune tune` puts first on PYTHONPATH for its profiling run: its sitecustomize.py reads the user's
model inside the user's own process (calibrate/inspect_model.py). Nothing imports this package."""
