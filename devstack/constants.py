"""The one set of demo values of the local stack: the COS bucket, region and credentials.

The COS stand-in accepts exactly these credentials; ``make demo``, ``make airflow`` and the tests all
use them. They protect nothing (everything listens on 127.0.0.1 only) and are never valid on COS.
"""

from __future__ import annotations

#: the local COS bucket (the DAGs' default URIs point into it as well)
BUCKET = "emr-ray-demo-1250000000"
REGION = "ap-guangzhou"
SECRET_ID = "AKIDlocalDemoSecretId0001"
#: distinctive, so tests can assert it never shows up in logs, messages or rendered fields
SECRET_KEY = "local-demo-secret-key-not-for-production"
