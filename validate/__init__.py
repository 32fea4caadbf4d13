"""zerotune validate: the command line, and (later) tune's top-k experiments."""

__all__: list[str] = []
