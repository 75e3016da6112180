"""The version of PORT (one place: port.__version__, the profiles' host records)."""
__version__ = "0.1.0"
