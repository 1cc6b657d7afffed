"""The provider's exceptions: one base, specific subclasses whose messages name the input and the fix.

Errors that a retry cannot fix also subclass Airflow's ``AirflowFailException``, so the task fails
at once instead of spending its retries: a wrong token, a job the Jobs API rejects, a cluster too
small or too old for the run, a job that failed on its input, a job someone stopped.
"""

from __future__ import annotations

from airflow.exceptions import AirflowException
from airflow.sdk.exceptions import AirflowFailException


class EmrRayError(AirflowException):
    """Base of every error this provider raises on the Airflow side."""


class RayClusterError(EmrRayError):
    """The Ray cluster is unreachable, rejects our token, or lacks what the task requires."""


class RayJobsApiError(RayClusterError):
    """A Jobs API call failed. ``transient`` says whether a retry can fix it (connection errors,
    timeouts, 5xx, 429); ``http_status`` is the HTTP status, None when no answer came."""

    def __init__(self, message: str, *, status_code: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.http_status = status_code
        self.transient = transient


class RayAuthError(RayClusterError, AirflowFailException):
    """The cluster wants a token (401) or rejected ours (403): fix the connection; not retried."""


class RayConnectionConfigError(RayClusterError, AirflowFailException):
    """The ``ray`` connection is set up wrong (a bad TLS extra, a token that would go over plain http
    to another machine): fix the connection; refused before any request, not retried."""


class RayJobRejectedError(RayClusterError, AirflowFailException):
    """The Jobs API refused the submission (4xx: bad runtime_env, entrypoint or resources); not retried."""


class RayClusterUnfitError(RayClusterError, AirflowFailException):
    """The cluster runs an older Ray than required, or has fewer resources in total than the run asks for."""


class RayMonitorLostError(RayClusterError):
    """The Jobs API stayed unreachable for the whole monitoring budget. The job was not stopped and
    may still be running; a retry of the task reattaches to it."""


class RayJobFailedError(EmrRayError):
    """A Ray job ended FAILED or STOPPED; the message carries the job's own error text. Retried."""


class RayJobInputError(RayJobFailedError, AirflowFailException):
    """The job failed on its input (missing or bad data, bad config): a retry would fail the same way."""


class RayJobStoppedError(RayJobFailedError, AirflowFailException):
    """Someone stopped the job (dashboard, ``ray job stop``): STOPPED is final, the task is not retried."""


class RayJobTakenOverStoppedError(RayJobFailedError):
    """An earlier try's job that this try had taken over was stopped: most likely by that earlier try's
    late ``on_kill`` (Airflow declared it a zombie), not by a person. Not final: retried, and the
    retry submits its own job."""


class RayJobPendingTimeoutError(RayJobFailedError):
    """The job stayed PENDING longer than ``pending_timeout``; retried (other jobs may free resources)."""


class RayJobUnschedulableError(RayJobPendingTimeoutError, AirflowFailException):
    """The job stayed PENDING because it asks for more than the whole cluster has: not retried."""


class COSError(EmrRayError):
    """A COS call failed: missing bucket or key, bad credentials, or a bad URL."""


class MLflowRegistryError(EmrRayError):
    """A model could not be registered or promoted."""


class RegistryIncompleteError(MLflowRegistryError):
    """The registry could not say completely what live model versions need (MLflow down, a model this
    login may not read): housekeeping removed no committed data. A retry asks again."""


class MLflowMetricNotFiniteError(MLflowRegistryError, AirflowFailException):
    """The run's gate metric is NaN or infinite: nothing is registered, and the task fails without retry."""


class MLflowAuthError(MLflowRegistryError, AirflowFailException):
    """MLflow refused the connection's credentials (401) or their permission (403): fix the connection or
    the user's permissions; not retried."""
