"""autopelt: search for the best parameter-efficient fine-tuning (delta) of a transformer for a task."""

__version__ = "0.1.0"
