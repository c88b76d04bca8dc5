"""See project/extras/__init__.py."""
