"""fsspec filesystems for Airflow's object storage (``ObjectStoragePath``): ``cos://``."""
