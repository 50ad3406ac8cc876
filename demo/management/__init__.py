"""Management commands of the demo app."""
