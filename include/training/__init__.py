"""Training code shared by the models in include/models (runs on the Ray cluster)."""
