"""The Spark session the job runs in and the Iceberg catalog it writes to."""
