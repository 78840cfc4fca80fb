"""The package's version (pyproject.toml's), in a module of its own: the build side stamps bundles with it and the
command line and the server report it, none of them importing the package's whole API for one string."""

__version__ = "0.1.0"
