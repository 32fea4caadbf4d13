"""zerotune calibrate: fits a cluster's efficiency profile from measurements (not yet implemented)."""

__all__: list[str] = []
