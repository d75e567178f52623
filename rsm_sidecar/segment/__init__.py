"""Segments in object storage: copying one in (``copy``) and reading one back
(``reader``), shared by the gRPC service, the inspection CLI and the Iceberg jobs."""
