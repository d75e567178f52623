"""``spark-submit`` entry point of the Iceberg jobs (docs/iceberg.md "On a Spark cluster").

    spark-submit [Spark options] --py-files rsm_sidecar.zip \
        rsm_sidecar/iceberg/submit/rsm_iceberg_job.py convert --config sidecar.toml --topic T

The arguments are those of ``rsm-sidecar iceberg ...``. This file lives in a directory of its
own on purpose: ``spark-submit`` (like ``python file.py``) puts the main file's directory first
on ``sys.path``, and the package's directories hold modules named like standard-library ones
(``rsm_sidecar/iceberg/types.py``, ``rsm_sidecar/cli/inspect.py``) that would shadow them.
"""

import sys

from rsm_sidecar.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["iceberg", *sys.argv[1:]]))
