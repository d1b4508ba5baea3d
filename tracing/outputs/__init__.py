"""The ground floor every stage writes through: table schemas, Parquet store, output manifests, errors,
labels and the version."""
