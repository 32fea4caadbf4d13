"""zerotune's benchmarks: the head-to-head against DeepSpeed's autotuner (headtohead.py)."""

__all__: list[str] = []
