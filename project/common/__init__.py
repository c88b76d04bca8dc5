"""Small torch-free helpers used by both training and deployment (they import nothing above)."""
