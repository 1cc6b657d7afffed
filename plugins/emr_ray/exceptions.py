"""The provider's exceptions: one base, specific subclasses whose messages name the input and the fix."""

from __future__ import annotations

from airflow.exceptions import AirflowException


class EmrRayError(AirflowException):
    """Base of every error this provider raises on the Airflow side."""


class RayClusterError(EmrRayError):
    """The Ray cluster is unreachable, rejects our token, or lacks what the task requires."""


class RayJobFailedError(EmrRayError):
    """A Ray job ended FAILED or STOPPED; the message carries the job's own error text."""


class COSError(EmrRayError):
    """A COS call failed: missing bucket or key, bad credentials, or a bad URL."""


class MLflowRegistryError(EmrRayError):
    """A model could not be registered or promoted."""
