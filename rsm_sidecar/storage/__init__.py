"""Object storage: the ``ObjectStore`` contract and its errors (:mod:`.base`), the backends
(:mod:`.local`, :mod:`.s3`, :mod:`.gcs`, each imported only when chosen), their settings
(:mod:`.s3_settings`, :mod:`.gcs_settings`) and :func:`.factory.open_store`."""
