"""``python -m emr_ray.audit``: see :mod:`emr_ray.audit.cli`."""

import sys

from emr_ray.audit.cli import main

sys.exit(main())
