"""zerotune validate: the command line (cli), `tune`'s top-k experiments and results folder (tune, settings,
calibration, profiling_run, runs, search, experiments, results), the `predict` verb's planning and reports (plan, report, grid, plots) and the accuracy reports against
published and measured runs (accuracy)."""

__all__: list[str] = []
