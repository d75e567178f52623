"""Key and value bytes -> columns: schema-registry framing, schemas, the seed's Protobuf and Avro mapping."""
