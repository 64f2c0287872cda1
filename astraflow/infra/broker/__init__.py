"""The development Apache Kafka broker (KRaft), run from the Maven Central jars: one node or a
three-node cluster, plain or SASL_SSL with SCRAM and each role's ACLs (``acls.py``)."""
